//! The gate of one model: a request is admitted at once while nobody waits and the model has
//! room, else it waits in the model's [`Queue`] until room appears, its timeout passes, its
//! client goes away, or the proxy drains.
//!
//! "Room" is the caller's ([`Room`]); the gate asks when a request arrives and whenever room
//! may have appeared: a permit dropped (a request ended), [`ModelGate::notify`], and every
//! [`RECHECK_EVERY`] while anything waits (loads also fall because of other nodes). Each
//! request that leaves re-checks room for the next, so requests leave in (priority, tenant
//! turn, arrival) order as room appears, one at a time.
//!
//! The fast path (nobody waits, room) is one uncontended mutex and a few atomics, no
//! allocation. The queued path allocates one oneshot channel. One lock guards the queue, the
//! token buckets and the settings; nothing is sent or dropped while it is held (a permit's
//! drop takes the lock), so handing out a permit and a client's drop never deadlock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::budget::{Buckets, Charge};
use super::classify::Class;
use super::metrics::{AdmissionFamilies, GateMetrics, TenantCounters};
use super::permit::AdmissionPermit;
use super::queue::{Key, Queue};
use super::rejection::{Reason, Rejection};
use super::settings::{AdmissionDefaults, GateSettings};
use super::view::{BandSnapshot, BudgetSnapshot, GateView, TenantShare};

/// One live permit in [`ModelGate::permits`].
const LIVE: u64 = 1 << 32;
/// One not-started permit in [`ModelGate::permits`].
const STARTING: u64 = 1;

/// How often room is re-checked while anything waits.
pub const RECHECK_EVERY: Duration = Duration::from_millis(20);

/// Tenants listed per band in the view.
const VIEW_TOP_TENANTS: usize = 10;

/// What a gate has let in and not seen end, for the caller's room rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admitted {
    /// Live permits: requests admitted here that have not ended.
    pub live: usize,
    /// Of those, the ones whose permit was not yet marked [`AdmissionPermit::started`]:
    /// admitted, but not yet counted by any load gauge or reservation (between admission and
    /// the routing decision or the upstream request).
    pub starting: usize,
}

/// Whether a model can take one more request now (the caller's rule: pods' loads against
/// `maxConcurrency` and their engine reports, see [`super::FullWhen`]).
///
/// It is called with the gate's lock held, so calls for one model never overlap and an answer
/// is acted on before the next question; it must not call back into the gate. A rule that
/// counts free slots from load gauges should subtract `admitted.starting`, so that requests
/// admitted a moment ago, not in the gauges yet, are not admitted twice over.
pub trait Room: Send + Sync + 'static {
    fn has_room(&self, admitted: Admitted) -> bool;
}

impl<F: Fn(Admitted) -> bool + Send + Sync + 'static> Room for F {
    fn has_room(&self, admitted: Admitted) -> bool {
        self(admitted)
    }
}

/// Tokens charged to one tenant, with the counter their final amount is added to.
#[derive(Debug)]
pub(super) struct TokenCharge {
    pub(super) charge: Charge,
    pub(super) counter: IntCounter,
}

type Answer = Result<AdmissionPermit, Rejection>;

struct Waiter {
    tx: oneshot::Sender<Answer>,
    deadline: Instant,
    tokens: Option<TokenCharge>,
}

struct State {
    queue: Queue<Waiter>,
    settings: GateSettings,
    room: Arc<dyn Room>,
    buckets: Option<Buckets>,
    tenants: TenantCounters,
    /// Set by [`ModelGate::close`]: nothing new is queued.
    closing: bool,
    /// Set when the model went away.
    removed: bool,
    /// Whether the re-check task runs.
    ticking: bool,
}

/// One model's admission.
pub struct ModelGate {
    model: Arc<str>,
    /// Token buckets kept at most.
    max_buckets: usize,
    state: Mutex<State>,
    /// Live permits (`LIVE` units, the high half) and of those the ones not marked started
    /// (`STARTING` units, the low half), in one word so that handing out and releasing a
    /// permit is one atomic add each.
    permits: AtomicU64,
    /// Mirrors the queue's length, so a permit's drop skips the lock when nobody waits.
    queued: AtomicUsize,
    /// Whether the model has a token budget (so callers compute an estimate only then).
    budgeted: AtomicBool,
    metrics: GateMetrics,
    emptied: Notify,
}

impl std::fmt::Debug for ModelGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGate")
            .field("model", &self.model)
            .field("admitted", &self.admitted())
            .field("queued", &self.queued)
            .finish()
    }
}

/// The first step of an admission.
enum Enter {
    Done(Answer),
    Queued(Waiting),
}

impl ModelGate {
    /// A gate running `settings` (from [`AdmissionDefaults::settings`]), asking `room`.
    pub fn new(
        model: Arc<str>,
        settings: GateSettings,
        room: Arc<dyn Room>,
        families: &AdmissionFamilies,
        defaults: &AdmissionDefaults,
    ) -> Arc<Self> {
        let now = Instant::now().into_std();
        let max_buckets = defaults.max_buckets;
        let budget = settings.budget;
        Arc::new(Self {
            metrics: GateMetrics::resolve(families, &model),
            state: Mutex::new(State {
                queue: Queue::default(),
                settings,
                room,
                buckets: budget.map(|b| Buckets::new(b, max_buckets, now)),
                tenants: TenantCounters::new(families, &model, defaults.tenant_label_cap),
                closing: false,
                removed: false,
                ticking: false,
            }),
            model,
            max_buckets,
            permits: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            budgeted: AtomicBool::new(budget.is_some()),
            emptied: Notify::new(),
        })
    }

    pub fn model(&self) -> &Arc<str> {
        &self.model
    }

    /// Requests admitted here and not ended, and how many of them are not started.
    pub fn admitted(&self) -> Admitted {
        let p = self.permits.load(Ordering::SeqCst);
        Admitted {
            live: (p / LIVE) as usize,
            starting: (p % LIVE) as usize,
        }
    }

    /// One more permit out (under the lock).
    fn hand_out(&self) {
        self.permits.fetch_add(LIVE + STARTING, Ordering::SeqCst);
    }

    /// A permit's request is in the load gauges now.
    pub(super) fn started(&self) {
        self.permits.fetch_sub(STARTING, Ordering::SeqCst);
    }

    /// Whether the model has a token budget (requests then carry a token estimate).
    pub fn has_budget(&self) -> bool {
        self.budgeted.load(Ordering::Relaxed)
    }

    /// Requests waiting.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("admission gate lock")
    }

    /// New settings and room rule (a rebuilt routing table). Waiting requests keep their
    /// deadlines and places; queued tenants take new weights from their next turn; token
    /// balances are kept under the new burst.
    pub fn update(self: &Arc<Self>, settings: GateSettings, room: Arc<dyn Room>) {
        {
            let mut st = self.lock();
            if st.settings.tenant_weights != settings.tenant_weights {
                let weights = &settings.tenant_weights;
                st.queue.reweigh(|tenant| weights.get(tenant));
            }
            let budget = settings.budget;
            st.settings = settings;
            st.room = room;
            self.budgeted.store(budget.is_some(), Ordering::Relaxed);
            st.buckets = match (st.buckets.take(), budget) {
                (Some(mut b), Some(budget)) => {
                    b.set_budget(budget);
                    Some(b)
                }
                (None, Some(budget)) => Some(Buckets::new(
                    budget,
                    self.max_buckets,
                    Instant::now().into_std(),
                )),
                (_, None) => None,
            };
        }
        self.dispatch();
    }

    /// Admit a request of `class`, charging `tokens` (the estimate, see
    /// [`super::budget::estimate`]) to its tenant's budget if the model has one. The request
    /// enters at this call: admitted or refused at once when it can be (the future is then
    /// ready), else queued. The future does not borrow the request; dropping it (the client
    /// went away) takes the request out of the queue at once, and it is never admitted. Call
    /// it inside a Tokio runtime: the first request to queue starts the re-check task.
    pub fn admit(self: &Arc<Self>, class: &Class<'_>, tokens: u64) -> Admit {
        match self.enter(class, tokens) {
            Enter::Done(answer) => Admit(AdmitState::Done(Some(answer))),
            Enter::Queued(waiting) => Admit(AdmitState::Queued(Box::pin(waiting.wait()))),
        }
    }

    /// Capacity may have freed (loads fell): let waiting requests re-check room.
    pub fn notify(self: &Arc<Self>) {
        if self.queued() > 0 {
            self.dispatch();
        }
    }

    fn enter(self: &Arc<Self>, class: &Class<'_>, tokens: u64) -> Enter {
        let mut st = self.lock();
        if st.removed {
            return self.refuse(Rejection::ModelRemoved);
        }
        let charge = match self.charge(&mut st, class, tokens) {
            Ok(c) => c,
            Err(r) => return self.refuse(r),
        };
        if st.queue.is_empty() && st.room.has_room(self.admitted()) {
            self.hand_out();
            self.metrics.admitted_at_once();
            drop(st);
            return Enter::Done(Ok(AdmissionPermit::new(
                Arc::clone(self),
                charge,
                Duration::ZERO,
            )));
        }
        let now = Instant::now();
        if st.closing {
            refund(&mut st, charge);
            return self.refuse(Rejection::Shutdown);
        }
        let mut shed = None;
        if st.queue.len() >= st.settings.max_size {
            let retry_after = retry_estimate(&st, now);
            match st.queue.shed_victim(class.priority) {
                Some(key) => shed = self.take(&mut st, &key).map(|(w, _)| (w, retry_after)),
                None => {
                    refund(&mut st, charge);
                    return self.refuse(Rejection::QueueFull { retry_after });
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        let deadline = now + st.settings.timeout_for(class.priority);
        let tenant = class.tenant;
        let state = &mut *st;
        let weights = &state.settings.tenant_weights;
        let weight = || weights.get(tenant.hash);
        let key = state.queue.push(
            class.priority,
            tenant.hash,
            || Arc::from(tenant.label()),
            weight,
            now,
            Waiter {
                tx,
                deadline,
                tokens: charge,
            },
        );
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.metrics.depth(class.priority).inc();
        if !st.ticking {
            st.ticking = true;
            tokio::spawn(Arc::clone(self).recheck());
        }
        drop(st);
        if let Some((victim, retry_after)) = shed {
            self.metrics.rejected(Reason::Shed);
            let _ = victim.tx.send(Err(Rejection::Shed { retry_after }));
        }
        // Room may be there (a notify not yet seen), and the new request may be next.
        self.dispatch();
        Enter::Queued(Waiting {
            gate: Arc::clone(self),
            key,
            rx,
            deadline,
            armed: true,
        })
    }

    fn refuse(&self, r: Rejection) -> Enter {
        self.metrics.rejected(r.reason());
        Enter::Done(Err(r))
    }

    /// Charge the estimate to the tenant's bucket, if the model has a budget.
    fn charge(
        &self,
        st: &mut State,
        class: &Class<'_>,
        tokens: u64,
    ) -> Result<Option<TokenCharge>, Rejection> {
        let Some(buckets) = st.buckets.as_mut() else {
            return Ok(None);
        };
        let now = Instant::now().into_std();
        let charge = buckets
            .try_charge(class.tenant.hash, tokens, now)
            .map_err(|retry_after| Rejection::RateLimited { retry_after })?;
        let tenant = class.tenant;
        let counter = st.tenants.counter(tenant.hash, || tenant.label());
        Ok(Some(TokenCharge { charge, counter }))
    }

    /// Take one waiter out of the queue (its charge refunded), keeping the counts; with
    /// when it arrived.
    fn take(&self, st: &mut State, key: &Key) -> Option<(Waiter, Instant)> {
        let q = st.queue.remove(key)?;
        self.left(st, q.key.priority);
        let mut w = q.value;
        refund(st, w.tokens.take());
        Some((w, q.enqueued))
    }

    /// Bookkeeping of a request that left the queue.
    fn left(&self, st: &State, priority: i32) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
        self.metrics.depth(priority).dec();
        if st.queue.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    /// Hand out permits while there is room and someone waits.
    pub(super) fn dispatch(self: &Arc<Self>) {
        loop {
            let (tx, answer) = {
                let mut st = self.lock();
                if st.queue.is_empty() || !st.room.has_room(self.admitted()) {
                    return;
                }
                let q = st.queue.pop().expect("a queue with requests pops");
                self.left(&st, q.key.priority);
                let mut w = q.value;
                let now = Instant::now();
                if w.tx.is_closed() {
                    // The client left between its drop and its cleanup: never admitted.
                    refund(&mut st, w.tokens.take());
                    self.metrics.cancelled.inc();
                    continue;
                }
                if now >= w.deadline {
                    refund(&mut st, w.tokens.take());
                    self.metrics.rejected(Reason::QueueTimeout);
                    let waited = now - q.enqueued;
                    let r = Rejection::QueueTimeout {
                        waited,
                        retry_after: retry_estimate(&st, now).max(waited.min(st.settings.timeout)),
                    };
                    (w.tx, Err(r))
                } else {
                    self.hand_out();
                    let waited = now - q.enqueued;
                    self.metrics.wait.observe(waited.as_secs_f64());
                    (w.tx, Ok((w.tokens.take(), waited)))
                }
            };
            match answer {
                Ok((tokens, waited)) => {
                    let permit = AdmissionPermit::new(Arc::clone(self), tokens, waited);
                    if let Err(Ok(permit)) = tx.send(Ok(permit)) {
                        // Its receiver went away after the check above.
                        self.metrics.cancelled.inc();
                        permit.abandon();
                    }
                }
                Err(r) => {
                    let _ = tx.send(Err(r));
                }
            }
        }
    }

    /// A permit ended (`dispatch`: let the next one in; `started`: it was marked so).
    pub(super) fn release(
        self: &Arc<Self>,
        tokens: Option<TokenCharge>,
        started: bool,
        dispatch: bool,
    ) {
        let units = if started { LIVE } else { LIVE + STARTING };
        self.permits.fetch_sub(units, Ordering::SeqCst);
        if let Some(t) = tokens {
            // Never corrected: the estimate stays charged.
            t.counter.inc_by(t.charge.estimate);
        }
        if dispatch && self.queued() > 0 {
            self.dispatch();
        }
    }

    /// A permit's request used `actual` tokens.
    pub(super) fn correct(&self, tokens: TokenCharge, actual: u64) {
        tokens.counter.inc_by(actual);
        let mut st = self.lock();
        if let Some(b) = st.buckets.as_mut() {
            b.correct(tokens.charge, actual, Instant::now().into_std());
        }
    }

    /// A permit that was never used gives its tokens back.
    pub(super) fn refund(&self, tokens: TokenCharge) {
        refund(&mut self.lock(), Some(tokens));
    }

    /// A waiter's future was dropped: it leaves at once.
    fn cancel(&self, key: &Key) {
        let mut st = self.lock();
        if self.take(&mut st, key).is_some() {
            self.metrics.cancelled.inc();
        }
    }

    /// A waiter's deadline passed; None if it already left (its answer is on its way).
    fn expire(&self, key: &Key) -> Option<Rejection> {
        let mut st = self.lock();
        let now = Instant::now();
        // Asked before it leaves: it is likely the oldest.
        let retry_after = retry_estimate(&st, now);
        let (_, enqueued) = self.take(&mut st, key)?;
        self.metrics.rejected(Reason::QueueTimeout);
        Some(Rejection::QueueTimeout {
            waited: now - enqueued,
            retry_after,
        })
    }

    /// Re-check room every [`RECHECK_EVERY`] while anything waits.
    async fn recheck(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RECHECK_EVERY).await;
            {
                let mut st = self.lock();
                if st.queue.is_empty() {
                    st.ticking = false;
                    return;
                }
            }
            self.dispatch();
        }
    }

    /// Drain: nothing new is queued; waiting requests are admitted as room appears until
    /// `deadline`, then every one still waiting is answered [`Rejection::Shutdown`]. Returns
    /// how many were answered so (none is dropped silently).
    pub async fn close(self: &Arc<Self>, deadline: Instant) -> usize {
        self.lock().closing = true;
        self.dispatch();
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.queued() == 0 {
                return 0;
            }
            tokio::select! {
                _ = &mut emptied => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.answer_all(Rejection::Shutdown)
    }

    /// The model went away: every waiting request is answered, and new ones are refused.
    pub fn remove(&self) -> usize {
        self.lock().removed = true;
        self.answer_all(Rejection::ModelRemoved)
    }

    fn answer_all(&self, r: Rejection) -> usize {
        let waiters: Vec<Waiter> = {
            let mut st = self.lock();
            let all = st.queue.drain();
            all.into_iter()
                .map(|q| {
                    self.left(&st, q.key.priority);
                    let mut w = q.value;
                    refund(&mut st, w.tokens.take());
                    w
                })
                .collect()
        };
        let n = waiters.len();
        for w in waiters {
            self.metrics.rejected(r.reason());
            let _ = w.tx.send(Err(r));
        }
        n
    }

    /// The gate's state for `/debug/routing`.
    pub fn view(&self) -> GateView {
        let st = self.lock();
        let now = Instant::now();
        let ms = |d: Duration| d.as_millis() as u64;
        GateView {
            model: self.model.to_string(),
            queued: st.queue.len(),
            admitted: self.admitted().live,
            max_size: st.settings.max_size,
            timeout_ms: ms(st.settings.timeout),
            sheddable_timeout_ms: ms(st.settings.sheddable_timeout),
            oldest_wait_ms: st.queue.oldest().map(|t| ms(now - t)),
            closing: st.closing,
            bands: st
                .queue
                .bands(VIEW_TOP_TENANTS)
                .into_iter()
                .map(|b| BandSnapshot {
                    priority: b.priority,
                    depth: b.depth,
                    tenants: b.tenants,
                    oldest_wait_ms: b.oldest.map(|t| ms(now - t)),
                    top_tenants: b
                        .top_tenants
                        .into_iter()
                        .map(|l| TenantShare {
                            tenant: l.tenant.to_string(),
                            depth: l.depth,
                        })
                        .collect(),
                })
                .collect(),
            budget: st.buckets.as_ref().map(|b| BudgetSnapshot {
                tokens_per_minute: b.budget().tokens_per_minute,
                burst: b.budget().burst,
                buckets: b.len(),
                evicted: b.evicted(),
                tenant_labels: st.tenants.labelled(),
            }),
        }
    }
}

/// Give a charge back (under the lock).
fn refund(st: &mut State, tokens: Option<TokenCharge>) {
    if let (Some(t), Some(b)) = (tokens, st.buckets.as_mut()) {
        b.refund(t.charge, Instant::now().into_std());
    }
}

/// `Retry-After` of a queue refusal: how long the longest-waiting request has waited (what
/// the queue takes to turn over now), from 1 s to the queue timeout.
fn retry_estimate(st: &State, now: Instant) -> Duration {
    let waited = st.queue.oldest().map_or(Duration::ZERO, |t| now - t);
    waited.clamp(
        Duration::from_secs(1),
        st.settings.timeout.max(Duration::from_secs(1)),
    )
}

/// An admission in progress, from [`ModelGate::admit`]: ready at once when the request was
/// admitted or refused on arrival, else waiting in the queue. Dropping it takes a waiting
/// request out of the queue.
#[must_use = "dropping it takes the request out of the queue"]
pub struct Admit(AdmitState);

enum AdmitState {
    Done(Option<Answer>),
    /// Boxed, so the common ready case stays small to move.
    Queued(Pin<Box<dyn Future<Output = Answer> + Send>>),
}

impl Future for Admit {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        match &mut self.0 {
            AdmitState::Done(answer) => {
                Poll::Ready(answer.take().expect("Admit polled after it completed"))
            }
            AdmitState::Queued(waiting) => waiting.as_mut().poll(cx),
        }
    }
}

/// A queued request's wait for its answer.
struct Waiting {
    gate: Arc<ModelGate>,
    key: Key,
    rx: oneshot::Receiver<Answer>,
    deadline: Instant,
    /// Whether dropping this must take the request out of the queue.
    armed: bool,
}

impl Waiting {
    async fn wait(mut self) -> Answer {
        let got = tokio::time::timeout_at(self.deadline, &mut self.rx).await;
        if let Ok(answer) = got {
            self.armed = false;
            return answer.unwrap_or(Err(Rejection::Shutdown));
        }
        let expired = self.gate.expire(&self.key);
        self.armed = false;
        match expired {
            Some(r) => Err(r),
            // It left the queue just now: its answer is being sent.
            None => (&mut self.rx).await.unwrap_or(Err(Rejection::Shutdown)),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.armed {
            self.gate.cancel(&self.key);
        }
    }
}

#[cfg(test)]
mod tests;
