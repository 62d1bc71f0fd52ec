//! A routing decision: where one request goes, why, and what it holds while it goes there.
//!
//! The decision owns its remaining candidates as a cursor (pods in the strategy's order, up
//! to the attempt limit, then the model's Service), so a failed attempt moves on without
//! re-hashing, and nothing past the candidates actually tried is computed. It also holds what
//! its pick stands for until the request starts upstream (a least-loaded reservation of the
//! pod, a label group's reservation of the member, a bounded pick pending on its pod), and it
//! owns their lifecycle: [`Decision::start_on`] when the request starts on an attempt's target
//! (counted in flight there first, then what stood for it is released), [`Decision::abandon`]
//! when an attempt fails before starting. The proxy and the replay call the same two methods;
//! a decision dropped without starting releases everything (reservations expire, counted).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::health::Health;
use super::pending::PendingPick;
use super::reservation::Reservation;
use super::teaching::{Lesson, Prefill, SlotTurn};
use crate::balance::bounded::BoundedWalk;
use crate::balance::cache_aware::CacheAwareOrder;
use crate::balance::least_loaded::Ranked;
use crate::balance::ring::WalkState;
use crate::balance::round_robin::Rotation;
use crate::keys::chain::PromptChain;
use crate::keys::{Ignored, RoutingKey};
use crate::load::userspace::{InFlight, UserspaceGauge};
use crate::load::Slot;
use crate::table::{LabelGroup, ModelRoute, Pod};
use crate::vocab::{GroupOutcome, KeySource, LabelGroupMode, Outcome, Strategy};

/// A prefill of a request's prompt in progress on its pod, which the request waits for rather
/// than compute the prompt again beside it.
#[derive(Debug, Clone)]
pub enum PrefillInProgress {
    /// Another request of this proxy's (see `teaching`).
    Here(Arc<Prefill>),
    /// Another proxy's: the pod's slot view shows a busy slot computing the prompt, as the
    /// view of the pod in this gauge slot says (see `other_prefill`).
    Elsewhere(Slot),
}

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

/// The cursor's next pod that is neither ejected nor full (see `super::room`). For the first
/// pick (`or_ejected`), when every candidate is passed over, the first of them: a pod that may have recovered beats no answer (the
/// ejection share keeps this to models whose every pod failed, such as a one-pod model).
/// Retries never go to an ejected pod.
/// Also returns how many candidates it passed over before its answer.
fn next_healthy(
    cursor: &mut Cursor,
    model: &ModelRoute,
    (health, full): (&Health, Option<&[bool]>),
    at: Instant,
    or_ejected: bool,
) -> (Option<usize>, u32) {
    let mut skipped = None;
    let mut passed = 0u32;
    while let Some(i) = cursor.next(model) {
        let passed_over = full.is_some_and(|f| f.get(i) == Some(&true))
            || health.is_ejected(model.pods[i].slot, at);
        if !passed_over {
            return (Some(i), passed);
        }
        passed += 1;
        if or_ejected {
            skipped.get_or_insert(i);
        }
    }
    (skipped, passed)
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

impl<'a> Target<'a> {
    /// [`Target::label`] as a span attribute value (the pod's shared label, borrowed).
    pub fn label_value(&self) -> crate::telemetry::span::Value<'a> {
        match *self {
            Target::Pod(p) => (&p.label).into(),
            Target::Service(_) => crate::metrics::handles::SERVICE_TARGET.into(),
        }
    }

    /// [`Target::label`] for a span to hold until it ends (the pod's shared label, no copy).
    pub fn held_label(&self) -> crate::telemetry::span::HeldStr {
        match self {
            Target::Pod(p) => p.label.clone().into(),
            Target::Service(_) => crate::metrics::handles::SERVICE_TARGET.into(),
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

/// What a pick stands for until its request starts upstream (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Holds {
    /// The least-loaded reservation of a pod.
    pub(super) pod: Option<Reservation>,
    /// The least-loaded reservation of a label-group member.
    pub(super) member: Option<Reservation>,
    /// A bounded (or cache-aware) pick counted on its pod until the request starts.
    pub(super) pending: Option<PendingPick>,
}

/// What a decision holds right now (for tests and `/debug` views).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The key (gauge slot) of the pod reservation, if one is held.
    pub pod_reservation: Option<u64>,
    pub member_reservation: bool,
    pub pending_pick: bool,
}

/// A routing decision for one request.
#[derive(Debug)]
pub struct Decision {
    /// The model that serves the request (for a label group, the chosen member).
    model: Arc<ModelRoute>,
    strategy: Strategy,
    key: Option<RoutingKey>,
    outcome: Outcome,
    group: Option<GroupChoice>,
    /// Malformed explicit keys that were skipped.
    ignored: Vec<Ignored>,
    holds: Holds,
    /// The pod the key preferred, when the hash-balance bound moved the pick off it (the
    /// outcome is then [`Outcome::Spill`]).
    spill: Option<Spill>,
    /// Cache-aware: leading prompt-chain links the picked pod held (`None` when the index was
    /// not consulted).
    match_depth: Option<u32>,
    /// Cache-aware: the request's prompt chain, which the answer's cache report is checked
    /// against.
    prompt: Option<PromptChain>,
    /// Cache-aware: whether the match rested on a prefix another request in flight was still
    /// teaching the pod, and the links this request teaches it until the decision drops.
    taught: Option<(bool, Lesson)>,
    /// Cache-aware: the prefill of the matched prompt that another request is still computing
    /// on the picked pod, which this one waits for before it is sent.
    prefill_in_progress: Option<PrefillInProgress>,
    /// How long the request waited for that prefill.
    prefill_waited: Option<std::time::Duration>,
    /// The turn at the slot that holds its prompt that the wait gave the request, passed to
    /// the next waiter when the decision drops (the answer has ended).
    slot_turn: Option<SlotTurn>,
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
    /// Pods full at the decision's time (`None`: none, or all), passed over like ejected ones.
    full: Option<Box<[bool]>>,
    /// Candidates the first pick passed over, full or ejected, before the pod it took (the
    /// strategy's pick moved without the bound: `spill` does not count these).
    passed_over: u32,
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
        (health, full): (Arc<Health>, Option<Box<[bool]>>),
        at: Instant,
    ) -> Self {
        let (first, passed_over) =
            next_healthy(&mut cursor, &model, (&health, full.as_deref()), at, true);
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
            holds: Holds::default(),
            spill: None,
            match_depth: None,
            prompt: None,
            taught: None,
            prefill_in_progress: None,
            prefill_waited: None,
            slot_turn: None,
            health,
            full,
            passed_over,
            at,
        }
    }

    /// The model that serves the request (for a label group, the chosen member).
    pub fn model(&self) -> &Arc<ModelRoute> {
        &self.model
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The routing key (hashed; never the key's text).
    pub fn key(&self) -> Option<RoutingKey> {
        self.key
    }

    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The label-group part, when the request named a label.
    pub fn group(&self) -> Option<&GroupChoice> {
        self.group.as_ref()
    }

    /// Malformed explicit keys that were skipped.
    pub fn ignored(&self) -> &[Ignored] {
        &self.ignored
    }

    /// The pod the key preferred when the bound moved the pick off it.
    pub fn spill(&self) -> Option<Spill> {
        self.spill
    }

    /// Cache-aware: leading prompt-chain links the picked pod held.
    pub fn match_depth(&self) -> Option<u32> {
        self.match_depth
    }

    /// What the decision holds for its pick right now.
    pub fn held(&self) -> Held {
        Held {
            pod_reservation: self.holds.pod.as_ref().map(Reservation::key),
            member_reservation: self.holds.member.is_some(),
            pending_pick: self.holds.pending.is_some(),
        }
    }

    pub(super) fn hold(&mut self, holds: Holds) {
        self.holds = holds;
    }

    pub(super) fn set_group(&mut self, group: GroupChoice, member: Option<Reservation>) {
        self.group = Some(group);
        self.holds.member = member;
    }

    pub(super) fn set_match(
        &mut self,
        depth: u32,
        prompt: PromptChain,
        taught: Option<(bool, Lesson)>,
        prefill_in_progress: Option<PrefillInProgress>,
    ) {
        self.match_depth = Some(depth);
        self.prompt = Some(prompt);
        self.taught = taught;
        self.prefill_in_progress = prefill_in_progress;
    }

    /// Cache-aware: the prefill of this request's prompt in progress on its pod, to wait for
    /// before sending it there.
    pub fn prefill_in_progress(&self) -> Option<PrefillInProgress> {
        self.prefill_in_progress.clone()
    }

    /// The request waited `waited` for the prefill of its prompt on its pod, and holds `turn`
    /// at the slot that keeps it until the decision drops.
    pub fn waited_for_prefill(&mut self, waited: std::time::Duration, turn: Option<SlotTurn>) {
        self.prefill_in_progress = None;
        self.prefill_waited = Some(waited);
        self.slot_turn = turn;
        // What this request teaches took its time from now, not from its decision.
        if let Some((_, lesson)) = &self.taught {
            lesson.sent_now();
        }
    }

    /// How long the request waited for another's prefill of its prompt, if it did.
    pub fn prefill_waited(&self) -> Option<std::time::Duration> {
        self.prefill_waited
    }

    /// The answer's first token came back: the prompt this request teaches its pod is there.
    pub fn prefilled(&self) {
        if let Some((_, lesson)) = &self.taught {
            lesson.prefilled();
        }
    }

    /// Cache-aware: whether the picked pod's match rested on a prefix that another request in
    /// flight was still teaching it when this one was decided.
    pub fn match_still_taught(&self) -> bool {
        self.taught.as_ref().is_some_and(|(still, _)| *still)
    }

    /// Cache-aware: the request's prompt chain.
    pub fn prompt(&self) -> Option<&PromptChain> {
        self.prompt.as_ref()
    }

    /// The gauge slot an attempt's target counts under (the Service has none).
    fn slot_of(&self, a: Attempt) -> Option<Slot> {
        match a {
            Attempt::Pod(i) => self.model.pods[i].slot,
            Attempt::Service => None,
        }
    }

    /// The pod reservation, when it is the reservation of `slot`'s pod.
    fn take_pod_reservation(&mut self, slot: Option<Slot>) -> Option<Reservation> {
        self.holds
            .pod
            .take_if(|r| slot.is_some_and(|s| r.key() == u64::from(s)))
    }

    /// The request starts on the target of `a`: it counts in flight there (in this process's
    /// gauge, until the returned guard drops: what the pods' reports are moved by), and what
    /// stood for it is released: the pending
    /// pick, the member reservation, and the pod reservation when `a` is the reserved pod
    /// (consumed, so counted as such). The count comes first, so a concurrent pick never sees
    /// the pod without either.
    pub fn start_on(&mut self, a: Attempt, gauge: &Arc<UserspaceGauge>) -> Option<InFlight> {
        let slot = self.slot_of(a);
        let in_flight = slot.map(|s| gauge.enter(s));
        self.holds.pending = None;
        if let Some(r) = self.holds.member.take() {
            r.consume();
        }
        if let Some(r) = self.take_pod_reservation(slot) {
            r.consume();
        }
        in_flight
    }

    /// The attempt on `a` failed before the request started there: its pod reservation (if it
    /// was the reserved pod) ends now, counted as expired, rather than lingering as load on a
    /// pod that is not serving it.
    pub fn abandon(&mut self, a: Attempt) {
        let slot = self.slot_of(a);
        drop(self.take_pod_reservation(slot));
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
    /// lookups only), spill, and how many full or ejected pods the pick passed over (when any).
    /// Never key text.
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
        if self.passed_over > 0 {
            let _ = write!(v, "; passed-over={}", self.passed_over);
        }
        if let Some(w) = self.prefill_waited {
            let _ = write!(v, "; prefill-wait={}ms", w.as_millis());
        }
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
                None => {
                    next_healthy(
                        &mut self.cursor,
                        &self.model,
                        (&self.health, self.full.as_deref()),
                        self.at,
                        false,
                    )
                    .0
                }
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
