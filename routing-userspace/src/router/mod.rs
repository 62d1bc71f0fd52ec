//! The router: (table entry, request) -> [`Decision`].
//!
//! The router owns what a decision has consequences on: the load gauge it reads, the
//! reservation ledgers its least-loaded picks write, and the routing knobs. Choosing is a pure
//! function of the table entry, the request's key and the loads ([`crate::rules`] says which
//! rule applies, [`crate::balance`] orders the candidates); the only side effect is the
//! reservation a least-loaded pick records, which the decision then carries as a token, and
//! what a cache-aware pick teaches the prefix index. The proxy never works out from strategy
//! and outcome whether something was reserved.

pub mod decision;
pub mod feedback;
pub mod group;
pub mod health;
pub mod inflow;
pub mod knobs;
pub mod other_prefill;
pub mod pending;
pub mod prefix_index;
pub mod reservation;
mod room;
pub mod teaching;

#[cfg(test)]
mod agreement_tests;
#[cfg(test)]
mod balance_tests;
#[cfg(test)]
mod slot_prompt_tests;
#[cfg(test)]
mod test_world;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use crate::admission::FullWhen;
use crate::balance::bounded::{spilled_from, BoundedWalk, HashBalance};
use crate::balance::cache_aware;
use crate::balance::least_loaded::rank;
use crate::balance::random::random;
use crate::balance::ring::WalkState;
use crate::balance::round_robin::round_robin;
use crate::keys::chain::PromptChain;
use crate::keys::{self, KeySource, RequestParts};
use crate::load::{LoadGauge, Slot};
use crate::rules::{pod_choice, PodChoice};
use crate::signals::fleet::FleetPlace;
use crate::signals::slot_prompts::SlotState;
use crate::signals::{SignalStore, Usage};
use crate::table::{ModelRoute, Pod, Route, RoutingTable};
use crate::vocab::{EngineKind, Strategy};
pub use decision::{Attempt, Cursor, Decision, GroupChoice, Held, Spill, Target};
use decision::{Holds, PrefillInProgress};
use feedback::{CacheFeedback, Shortfall};
use health::{EjectionPolicy, Health};
use inflow::Inflow;
pub use knobs::RoutingKnobs;
use pending::PendingPicks;
use prefix_index::PrefixIndex;
use reservation::{Ledger, Loads, Reservation};
use teaching::{Reusable, Teaching};

pub struct Router {
    /// This node's view of each pod's requests in flight (node-wide with eBPF).
    gauge: Arc<dyn LoadGauge>,
    /// What the pods report of their own load; a pick reads the larger of the two.
    signals: Arc<SignalStore>,
    /// Passive health: pods ejected for failing are skipped.
    health: Arc<Health>,
    /// Reservations of pods, keyed by gauge slot (a pod serving several models is one load).
    pods: Arc<Ledger>,
    /// Reservations of label-group members, keyed by the member's name hash.
    members: Arc<Ledger>,
    /// What cache-aware picks sent where (all cache-aware models; chains carry the model).
    index: PrefixIndex,
    /// Bounded and cache-aware picks whose requests have not started upstream yet.
    pending: Arc<PendingPicks>,
    /// Predicted against reported cached tokens, per pod.
    feedback: CacheFeedback,
    /// The links cache-aware requests in flight are teaching their pods.
    teaching: Arc<Teaching>,
    /// The new links cache-aware picks sent each pod lately.
    inflow: Inflow,
    /// When an engine report makes a pod full (see [`room`]).
    full_when: FullWhen,
    /// The proxies in front of the same pods (0 until discovery has counted them), and this
    /// one's rank among them.
    fleet: FleetPlace,
    knobs: RoutingKnobs,
}

impl Router {
    /// A router reading `gauge` alone (no engine reports arrive in its store).
    pub fn new(gauge: Arc<dyn LoadGauge>, knobs: RoutingKnobs) -> Self {
        let local = Arc::new(crate::load::userspace::UserspaceGauge::default());
        let signals = Arc::new(SignalStore::new(
            crate::signals::store::DEFAULT_STALENESS,
            local,
        ));
        Self::with_signals(gauge, signals, knobs, EjectionPolicy::default())
    }

    /// A router reading `gauge` and the pods' own reports in `signals`.
    pub fn with_signals(
        gauge: Arc<dyn LoadGauge>,
        signals: Arc<SignalStore>,
        knobs: RoutingKnobs,
        ejection: EjectionPolicy,
    ) -> Self {
        Self {
            gauge,
            signals,
            health: Arc::new(Health::new(ejection)),
            pods: Ledger::new(knobs.reservation_ttl),
            members: Ledger::new(knobs.reservation_ttl),
            index: PrefixIndex::new(knobs.cache_aware_index_budget),
            pending: PendingPicks::new(),
            feedback: CacheFeedback::default(),
            teaching: Teaching::new(),
            inflow: Inflow::default(),
            full_when: FullWhen::default(),
            fleet: FleetPlace::fixed(1, 0),
            knobs,
        }
    }

    /// Read the fleet's size and this proxy's rank from `fleet` (what discovery counts, or
    /// `--fleet-size` and `--fleet-rank`); a new router counts itself alone.
    pub fn set_fleet(&mut self, fleet: FleetPlace) {
        self.fleet = fleet;
    }

    /// Whether this proxy is known to be the only one in front of its pods: then choices no
    /// other proxy must agree on may read what only it knows (what it sent each pod lately).
    pub fn routes_alone(&self) -> bool {
        self.fleet.size() == 1
    }

    /// The cache-aware prefix index.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// A new table was published: the index forgets pods no model has any more.
    pub fn table_rebuilt(&self, table: &RoutingTable) {
        let live: std::collections::HashSet<u32> = table
            .models()
            .flat_map(|m| m.pods.iter().filter_map(|p| p.slot))
            .collect();
        self.index.retain_pods(|s| live.contains(&s));
        self.inflow.retain_pods(|s| live.contains(&s));
    }

    /// The hash-balance settings of a model (see [`RoutingKnobs::balance_for`]).
    pub fn balance_for(&self, m: &ModelRoute) -> HashBalance {
        self.knobs.balance_for(&m.spec)
    }

    /// A pod's load as a bounded pick reads it, reservations apart: its load plus the bounded
    /// picks of it whose requests have not started yet.
    pub fn bounded_load(&self, pod: &Pod, now: Instant) -> u64 {
        self.pod_load(pod, now) + pod.slot.map_or(0, |s| self.pending.get(s))
    }

    /// Every pod's load as a bounded pick reads it: gauge, pending picks and unexpired
    /// reservations.
    pub fn pod_loads(&self, m: &ModelRoute, now: Instant) -> Loads {
        self.pods.loads(
            m.pods.len(),
            |i| m.pods[i].slot.map(u64::from),
            |i| self.bounded_load(&m.pods[i], now),
            now,
        )
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
        for slot in self.health.pods_changed(pods) {
            // A slot that now stands for another pod: its reports were the old pod's.
            self.signals.reset(slot);
            self.feedback.reset(slot);
        }
    }

    /// A pod's load as picks see it (reservations apart): the larger of this node's count of
    /// its requests in flight and what the pod's fresh report says (its engine's running and
    /// waiting requests plus what this node started there since).
    pub fn pod_load(&self, pod: &Pod, now: Instant) -> u64 {
        pod.slot
            .map_or(0, |s| self.signals.load(s, self.gauge.active(s), now))
    }

    /// What the pods report of their load.
    pub fn signals(&self) -> &Arc<SignalStore> {
        &self.signals
    }

    /// Predicted against reported cached tokens, per pod.
    pub fn feedback(&self) -> &CacheFeedback {
        &self.feedback
    }

    /// The answer to decision `d` served by its model's pod `i` reported `usage`: when the
    /// index predicted more than the pod found cached, it forgets what the pod lost (see
    /// [`feedback`]).
    pub fn cache_feedback(&self, d: &Decision, i: usize, usage: &Usage) {
        let (Some(chain), Some(predicted)) = (d.prompt(), d.match_depth()) else {
            return;
        };
        let Some(slot) = d.model().pods.get(i).and_then(|p| p.slot) else {
            return;
        };
        // The prediction was for the picked pod; another one (a retry) was predicted nothing.
        let predicted = match d.picked_index() == Some(i) {
            true => predicted as usize,
            false => 0,
        };
        let short = match feedback::verdict(chain, predicted, usage) {
            // The pod does not hold it yet: another request is still teaching it.
            feedback::Verdict::Lost { .. } if d.match_still_taught() => Shortfall::StillTaught,
            // Once: this request put it back. Again: the pod keeps little of what it is sent.
            feedback::Verdict::Lost { held } => match self.feedback.short_again(slot) {
                false => Shortfall::Kept,
                true => Shortfall::Forgot(self.index.forget(slot, &chain.links()[held..predicted])),
            },
            feedback::Verdict::Agrees => {
                self.feedback.agreed(slot);
                Shortfall::None
            }
            feedback::Verdict::Unknown => Shortfall::None,
        };
        let predicted_tokens = feedback::predicted_tokens(chain, predicted, usage);
        self.feedback.record(slot, predicted_tokens, usage, short);
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
        let (extraction, chain) = if strategy == Strategy::CacheAware {
            let anchors = self.reads_slot_prompts(m, now);
            keys::extract_with_chain(&parts, &self.knobs.limits, anchors)
        } else {
            (keys::extract(strategy, &parts, &self.knobs.limits), None)
        };
        let key = extraction.key;
        let pick = self.pick(m, key, chain.as_ref(), draw, now);
        let mut d = Decision::new(
            Arc::clone(m),
            strategy,
            key,
            extraction.ignored,
            pick.cursor,
            self.knobs.max_pod_attempts,
            (
                Arc::clone(&self.health),
                self.full_pods_keeping(m, now, pick.holder),
            ),
            now,
        );
        let picked_slot = d.picked_pod().and_then(|p| p.slot);
        if let (Some(depths), Some(chain)) = (pick.depths, chain) {
            let depth = d.picked_index().map_or(0, |i| depths[i]);
            let links = chain.links();
            // The index learns the chain for the pod the decision picked: the cache-aware
            // choice, unless passive health moved it off an ejected pod. Until the request
            // ends, the links it adds are still being taught to the pod.
            let streams = req.body.is_some_and(|b| b.streams());
            let mut prefill_in_progress = None;
            let taught = picked_slot.map(|slot| {
                let still_taught =
                    depth > 0 && self.teaching.in_flight(slot, links[depth as usize - 1]);
                // A match that counts, on a prompt another request is still computing on the
                // pod: this one waits for it rather than compute the same prompt beside it.
                let waits = cache_aware::counts(depth, links.len())
                    && !self.knobs.cache_aware_prefill_wait.is_zero();
                if still_taught && waits {
                    prefill_in_progress = self
                        .teaching
                        .prefill_in_progress(slot, links[depth as usize - 1])
                        .map(PrefillInProgress::Here);
                }
                // Another proxy's request computing it, as the pod's page shows.
                if prefill_in_progress.is_none() && waits {
                    prefill_in_progress = self.computing_elsewhere(slot, &chain, now);
                }
                self.index.learn(slot, links);
                let new_links = &links[depth as usize..];
                // Only a proxy alone reads what the pods were sent lately (a fleet's proxies
                // each see their own share, so they keep to the hash).
                if self.routes_alone() {
                    self.inflow.add(slot, new_links.len(), now);
                }
                if let Some(view) = self.signals.prompts().get(slot, now) {
                    view.sent(new_links.len());
                }
                let lesson = self
                    .teaching
                    .start(slot, new_links, self.reusable(m, slot, streams));
                (still_taught, lesson)
            });
            d.set_match(depth, chain, taught, prefill_in_progress);
        }
        // A model with a maxConcurrency reads every pick's pending count too: its room rule
        // must see the request from the moment admission lets it go (see `room`).
        let counts_pending = pick.reads_bound || m.spec.admission.max_concurrency.is_some();
        d.hold(Holds {
            pod: pick.reservation,
            member: None,
            pending: picked_slot
                .filter(|_| counts_pending)
                .map(|s| self.pending.hold(s)),
        });
        if let Some(s) = pick.spill {
            d.spilled(s);
        }
        d
    }

    /// Whether the pod in `slot` shows the prompt of `chain` only in a slot still computing it
    /// (for another proxy's request: see `other_prefill`).
    fn computing_elsewhere(
        &self,
        slot: Slot,
        chain: &PromptChain,
        now: Instant,
    ) -> Option<PrefillInProgress> {
        let views = self.signals.prompts();
        if !views.any_pod() {
            return None;
        }
        let computing = views.get(slot, now)?.computing(chain)?;
        let counts = cache_aware::counts(computing.depth, chain.links().len());
        (counts && computing.state == SlotState::Prefilling)
            .then_some(PrefillInProgress::Elsewhere(slot))
    }

    /// The candidates of one model for `key` by its strategy: a value per rule, with what the
    /// pick reserved, spilled and matched.
    fn pick(
        &self,
        m: &ModelRoute,
        key: Option<keys::RoutingKey>,
        chain: Option<&PromptChain>,
        draw: u64,
        now: Instant,
    ) -> Pick {
        let n = m.pods.len();
        if n == 0 {
            return Pick::plain(Cursor::None);
        }
        let source = key.map_or(KeySource::None, |k| k.source);
        match pod_choice(m.spec.routing, source, m.service.is_some()) {
            PodChoice::Service => Pick::plain(Cursor::None),
            PodChoice::RoundRobin => Pick::plain(Cursor::Rotation(round_robin(m.next_ticket(), n))),
            PodChoice::Random => Pick::plain(Cursor::Rotation(random(draw, n))),
            PodChoice::Ring => self.ring_pick(m, key.map_or(0, |k| k.hash), now),
            PodChoice::CacheAware => {
                let chain = chain.expect("a prompt-chain key has its chain");
                self.cache_aware(m, chain, now)
            }
            PodChoice::LeastLoaded => self.least_loaded(m, now),
        }
    }

    /// When a request for the prompt a request teaches the pod in `slot` may reuse it, so that
    /// such a request waits for it (see `teaching`); `None`: nobody waits. A streamed answer's
    /// first token says when a shared prefix cache holds it; a pod that keeps a prompt in the
    /// slot that computed it frees it at the answer's end.
    fn reusable(&self, m: &ModelRoute, slot: Slot, streams: bool) -> Option<Reusable> {
        // Only a streamed answer says how long its prompt took (its first token), which bounds
        // a wait for a slot (`teaching::WaitEnd::Recompute`).
        streams.then(|| {
            if self.caches_per_slot(m, slot) {
                Reusable::AtAnswerEnd
            } else {
                Reusable::AtFirstToken
            }
        })
    }

    /// Whether the pod in `slot` keeps a prompt in the slot that computed it (llama.cpp: the
    /// model's engine, or what its metrics page was read as), so that nothing reuses a prompt
    /// before the request that computed it ends (see `teaching`).
    fn caches_per_slot(&self, m: &ModelRoute, slot: Slot) -> bool {
        match m.spec.engine {
            EngineKind::LlamaCpp => true,
            EngineKind::Auto => self.signals().caches_per_slot(slot),
            EngineKind::Vllm | EngineKind::Sglang | EngineKind::None => false,
        }
    }

    /// The ring walk of `hash`, under the hash-balance bound when it is on.
    fn ring_pick(&self, m: &ModelRoute, hash: u64, now: Instant) -> Pick {
        let balance = self.balance_for(m);
        if !balance.is_on() {
            return Pick::plain(Cursor::Walk(WalkState::new(&m.ring, hash)));
        }
        let loads = self.pod_loads(m, now);
        let loads = loads.as_slice();
        let bound = balance
            .bound(loads.iter().sum(), m.pods.len())
            .expect("a bound that is on, over pods");
        Pick {
            spill: spilled_from(&m.ring, hash, loads, bound).map(|p| Spill {
                preferred: p,
                load: loads[p],
                bound,
            }),
            reads_bound: true,
            ..Pick::plain(Cursor::Bounded(BoundedWalk::new(
                &m.ring, hash, loads, bound,
            )))
        }
    }

    /// Least loaded first, reserving the pick.
    fn least_loaded(&self, m: &ModelRoute, now: Instant) -> Pick {
        let rr = m.next_ticket();
        let attempts = self.knobs.max_pod_attempts;
        let (order, token) = self.pods.pick(
            m.pods.len(),
            |i| m.pods[i].slot.map(u64::from),
            // An ejected pod ranks last (it is skipped unless nothing else is left).
            |i| match self.health.is_ejected(m.pods[i].slot, now) {
                true => u64::MAX / 2,
                false => self.pod_load(&m.pods[i], now),
            },
            |loads| rank(loads, rr, attempts),
            |order| order.clone().next(),
            |_| Arc::clone(&m.metrics.reservations),
            now,
        );
        Pick {
            reservation: token,
            ..Pick::plain(Cursor::Ranked(order))
        }
    }

    /// Whether some pod of `m` has a fresh view of its slots' prompts (llama.cpp's `/slots`):
    /// then requests are anchored to be looked up in it.
    fn reads_slot_prompts(&self, m: &ModelRoute, now: Instant) -> bool {
        let views = self.signals.prompts();
        views.any_pod()
            && m.pods
                .iter()
                .filter_map(|p| p.slot)
                .any(|s| views.has_fresh(s, now))
    }

    /// The cache-aware pick: depths from the index (and from the pods' own views of their
    /// slots' prompts, where they report them), loads from the gauge, the choice (pure); the
    /// caller teaches the index the chain for the pod the decision ends up with.
    fn cache_aware(&self, m: &ModelRoute, chain: &PromptChain, now: Instant) -> Pick {
        let n = m.pods.len();
        let links = chain.links();
        let mut depths = vec![0u32; n];
        self.index
            .depths(links, |slot| m.pod_of_slot(slot), &mut depths);
        let views: Vec<_> = match chain.anchors().is_empty() {
            true => Vec::new(),
            false => {
                let prompts = self.signals.prompts();
                m.pods
                    .iter()
                    .map(|p| p.slot.and_then(|s| prompts.get(s, now)))
                    .collect()
            }
        };
        // What a pod says it holds is what every proxy reads: a document another proxy placed
        // is found there.
        for (d, v) in depths.iter_mut().zip(&views) {
            if let Some(v) = v {
                *d = (*d).max(v.depth(chain));
            }
        }
        let balance = self.balance_for(m);
        let loads = self.pod_loads(m, now);
        let loads = loads.as_slice();
        let bound = balance.bound(loads.iter().sum(), n);
        // Alone, this proxy knows what every pod was sent lately: ties also keep that even. In
        // a fleet, when every pod reports what its slots hold, that is the view the proxies
        // share: ties keep it even, and the queues (see `cache_aware::Ties`).
        let alone = self.routes_alone();
        let counts = if alone {
            let mut inflow = vec![0u64; n];
            self.inflow
                .per_pod(|slot| m.pod_of_slot(slot), now, &mut inflow);
            Some(inflow)
        } else if views.len() == n && views.iter().all(Option::is_some) {
            let pods: Vec<_> = views.iter().flatten().map(|v| &**v).collect();
            // A prompt no pod holds goes where it costs the fleet least (see
            // `held_alone_units`); any other is kept even by what the pods hold.
            let new_prompt = !depths.iter().any(|&d| cache_aware::counts(d, links.len()));
            Some(match new_prompt {
                true => crate::signals::slot_prompts::held_alone_units(&pods),
                false => pods.iter().map(|v| v.held_units()).collect(),
            })
        } else {
            None
        };
        let ties = match (&counts, alone) {
            (None, _) => cache_aware::Ties::Walk,
            (Some(sent), true) => cache_aware::Ties::Sent(sent),
            (Some(held), false) => cache_aware::Ties::Held {
                held,
                rank: self.fleet.rank(),
            },
        };
        let choice = cache_aware::choose(&m.ring, links, &depths, loads, bound, ties);
        // The request waits in the queue of the one pod that holds its prompt rather than pay
        // the prompt again elsewhere (see `room`); in a fleet, a proxy that knows no holder
        // takes the hash's pick for it, as the fleet's other proxies do.
        // (A proxy alone never has such a pick: it knows every prompt it sent.)
        let holder = cache_aware::sole_holder(&depths, links.len())
            .or_else(|| cache_aware::agreed_holder(&choice, links.len()));
        Pick {
            holder,
            spill: choice.spilled_from.map(|p| Spill {
                preferred: p,
                load: loads[p],
                bound: bound.unwrap_or(u64::MAX),
            }),
            depths: Some(depths),
            reads_bound: true,
            ..Pick::plain(Cursor::CacheAware(choice.order))
        }
    }
}

/// What a strategy's rule chose for one model: the candidates, and what the choice holds or
/// tells (a reservation, a spill, the index's matched depths).
struct Pick {
    cursor: Cursor,
    reservation: Option<Reservation>,
    spill: Option<Spill>,
    /// Cache-aware: links of the chain each pod holds.
    depths: Option<Vec<u32>>,
    /// Cache-aware: the pod kept for the request while its engine queues (see `room`).
    holder: Option<usize>,
    /// A bounded pick: it counts as pending on its pod until the request starts.
    reads_bound: bool,
}

impl Pick {
    fn plain(cursor: Cursor) -> Self {
        Self {
            cursor,
            reservation: None,
            spill: None,
            depths: None,
            holder: None,
            reads_bound: false,
        }
    }
}
