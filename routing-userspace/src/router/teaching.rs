//! Prefixes still on their way into a pod's cache. The index learns a chain when it picks the
//! pod, before the engine holds it: until the request that taught it ends, the pod is still
//! prefilling it, or holds it in a slot that request keeps busy. A second request for the same
//! prefix that reaches the pod meanwhile finds it uncached, and its report then says nothing
//! about what the pod lost, so the closed loop ([`super::feedback`]) must not forget the
//! prefix for it. It did: on three llama.cpp servers, a document's second request, sent while
//! the first was prefilling, made the index forget the document, and its next requests were
//! placed afresh on another server.
//!
//! Each cache-aware request registers the links it adds to the index for its pod (at most
//! [`MAX_LINKS`], the first of them) until its decision drops; a prediction that counts on a
//! registered link is marked as resting on a lesson in flight.
//!
//! A lesson also says when its prompt can be reused on its pod ([`Prefill`], [`Reusable`]). An
//! engine with a shared prefix cache (vLLM, SGLang) holds the prompt from the answer's first
//! token on, but does not share a prefill in progress: a second request for the same prompt
//! that reaches it before then computes the whole prompt again beside the first, and both
//! finish later. Such a request waits for the first token instead (at most
//! `--cache-aware-prefill-wait`); a non-streamed answer says nothing before it ends, so nobody
//! waits for one. llama.cpp's server keeps a prompt in the slot that computed it, busy until
//! the answer ends, so a request held until the first token still finds nothing to reuse
//! (three llama.cpp servers: a document's second question held 8.5 s, then computed the
//! document again). There the wait lasts until the answer ends, and the waiters go one per
//! end: each takes the slot that holds the prompt and hands it to the next when its own answer
//! ends (released together, they raced for that one slot and the losers computed the prompt
//! again in the other). A long answer would keep them waiting for as long as it streams, so a
//! waiter stops once the slot has been busy past the first token for as long as computing the
//! prompt took ([`WaitEnd::Recompute`]): computing it again costs no more from then on (on a
//! GPU, a prompt takes a second where an answer streams for thirty). Which pods keep a prompt
//! per slot: `Router::caches_per_slot`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::load::Slot;

/// Links a request registers at most: 256 cuts of the chain, about 64,000 tokens of new prompt.
/// A prediction past them rests on an unregistered link and is judged as any other.
pub const MAX_LINKS: usize = 256;

/// When the next request for a lesson's prompt can reuse it on the lesson's pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reusable {
    /// From the streamed answer's first token, by any number of requests at once (an engine
    /// with a shared prefix cache: vLLM, SGLang).
    AtFirstToken,
    /// When the answer ends, by one request at a time: the slot that computed the prompt holds
    /// it (llama.cpp).
    AtAnswerEnd,
}

/// Whether a lesson's prompt can be reused yet: done at its first token or its end (as
/// [`Reusable`] says), or when the lesson ends however it ends (answered, failed, abandoned).
#[derive(Debug)]
pub struct Prefill {
    done: AtomicBool,
    notify: Notify,
    /// [`Reusable::AtAnswerEnd`]: the slot that holds the prompt, one permit handed from
    /// waiter to waiter (each holds it as a [`SlotTurn`] until its answer ends).
    slot: Option<Semaphore>,
    /// How long computing the prompt took, which is what a waiter saves by waiting for the
    /// slot.
    clock: Mutex<PrefillClock>,
}

/// When a lesson's request was sent to its pod, and when its first token came back.
#[derive(Debug, Clone, Copy)]
struct PrefillClock {
    sent: Instant,
    first_token: Option<Instant>,
}

/// How a wait for a prompt ended.
#[derive(Debug)]
pub enum WaitEnd {
    /// The prompt can be reused; on a slot, with this waiter's turn at it.
    Reusable(Option<SlotTurn>),
    /// The slot that holds the prompt stayed busy for as long again as computing the prompt
    /// took: the waiter computes it again rather than wait for a long answer to end.
    Recompute,
}

impl Prefill {
    fn new(reusable: Reusable) -> Self {
        Self {
            done: AtomicBool::new(false),
            notify: Notify::new(),
            slot: (reusable == Reusable::AtAnswerEnd).then(|| Semaphore::new(0)),
            clock: Mutex::new(PrefillClock {
                sent: Instant::now(),
                first_token: None,
            }),
        }
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// When the next request can reuse the prompt.
    pub fn reusable(&self) -> Reusable {
        if self.slot.is_some() {
            Reusable::AtAnswerEnd
        } else {
            Reusable::AtFirstToken
        }
    }

    /// The answer's first token: the prompt is computed (and reusable, on a shared cache).
    fn first_token(&self) {
        if self.slot.is_none() {
            return self.finish();
        }
        crate::lock::lock(&self.clock)
            .first_token
            .get_or_insert_with(Instant::now);
        self.notify.notify_waiters();
    }

    /// The lesson's request leaves only now (it waited for another's prompt first): its
    /// prompt's time starts here.
    fn sent_now(&self) {
        crate::lock::lock(&self.clock).sent = Instant::now();
    }

    fn finish(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            match &self.slot {
                Some(slot) => slot.add_permits(1),
                None => self.notify.notify_waiters(),
            }
        }
    }

    /// Until the prompt can be reused. A slot's prompt is reused by one waiter at a time: the
    /// turn returned passes the slot to the next waiter when it drops (with the waiter's
    /// answer), in the order they came; a waiter stops waiting when the slot stays busy for as
    /// long past the first token as the prompt took to compute.
    pub async fn done(self: &Arc<Self>) -> WaitEnd {
        if let Some(slot) = &self.slot {
            return tokio::select! {
                // Never closed; a waiter that stops drops its place in the queue.
                permit = slot.acquire() => {
                    permit.expect("never closed").forget();
                    WaitEnd::Reusable(Some(SlotTurn(Arc::clone(self))))
                }
                () = self.busy_longer_than_computing() => WaitEnd::Recompute,
            };
        }
        self.first_token_came().await;
        WaitEnd::Reusable(None)
    }

    /// Until the first token (or the lesson's end, on a shared cache): when the lesson's
    /// request was sent, and when its first token came.
    async fn first_token_came(&self) -> Option<(Instant, Instant)> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a token between the two is not missed.
            notified.as_mut().enable();
            if self.slot.is_none() && self.is_done() {
                return None;
            }
            let clock = *crate::lock::lock(&self.clock);
            if let Some(first) = clock.first_token {
                return Some((clock.sent, first));
            }
            notified.await;
        }
    }

    /// Until the slot has been busy past the first token for as long as the prompt took.
    async fn busy_longer_than_computing(&self) {
        let Some((sent, first)) = self.first_token_came().await else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(first + (first - sent)).await;
    }
}

/// A waiter's turn at the slot that holds a prompt, passed to the next waiter when it drops.
#[derive(Debug)]
pub struct SlotTurn(Arc<Prefill>);

impl Drop for SlotTurn {
    fn drop(&mut self) {
        if let Some(slot) = &self.0.slot {
            slot.add_permits(1);
        }
    }
}

/// One link a pod is being taught: by how many lessons, and the prefill a request that needs
/// it waits for (the earliest streamed lesson's that is not done).
#[derive(Debug)]
struct Taught {
    lessons: u32,
    prefill: Option<Arc<Prefill>>,
}

/// The links requests in flight are teaching, per pod.
#[derive(Debug, Default)]
pub struct Teaching {
    links: Mutex<HashMap<(Slot, u64), Taught>>,
}

impl Teaching {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(Slot, u64), Taught>> {
        crate::lock::lock(&self.links)
    }

    /// A request teaches `new_links` to the pod in `slot` until the lesson drops; with
    /// `reusable`, a request for the same prompt may wait for it (see [`Reusable`]).
    pub fn start(
        self: &Arc<Self>,
        slot: Slot,
        new_links: &[u64],
        reusable: Option<Reusable>,
    ) -> Lesson {
        let links: Box<[u64]> = new_links[..new_links.len().min(MAX_LINKS)].into();
        let prefill = reusable
            .filter(|_| !links.is_empty())
            .map(|r| Arc::new(Prefill::new(r)));
        if !links.is_empty() {
            let mut map = self.lock();
            for &link in links.iter() {
                let taught = map.entry((slot, link)).or_insert(Taught {
                    lessons: 0,
                    prefill: None,
                });
                taught.lessons += 1;
                if taught.prefill.as_ref().is_none_or(|p| p.is_done()) {
                    taught.prefill.clone_from(&prefill);
                }
            }
        }
        Lesson {
            teaching: Arc::clone(self),
            slot,
            links,
            prefill,
        }
    }

    /// Whether a request in flight is teaching `link` to the pod in `slot`.
    pub fn in_flight(&self, slot: Slot, link: u64) -> bool {
        self.lock().contains_key(&(slot, link))
    }

    /// The prefill of `link` on the pod in `slot` that cannot be reused yet, if any.
    pub fn prefill_in_progress(&self, slot: Slot, link: u64) -> Option<Arc<Prefill>> {
        let map = self.lock();
        let prefill = map.get(&(slot, link))?.prefill.as_ref()?;
        (!prefill.is_done()).then(|| Arc::clone(prefill))
    }

    /// Links registered over all pods (for tests and views).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request's links; dropping it ends the lesson.
#[derive(Debug)]
pub struct Lesson {
    teaching: Arc<Teaching>,
    slot: Slot,
    links: Box<[u64]>,
    prefill: Option<Arc<Prefill>>,
}

impl Lesson {
    /// The answer's first token came back: the prompt is computed, and reusable if the engine
    /// shares computed prefixes.
    pub fn prefilled(&self) {
        if let Some(p) = &self.prefill {
            p.first_token();
        }
    }

    /// The request leaves for its pod only now, after a wait of its own.
    pub fn sent_now(&self) {
        if let Some(p) = &self.prefill {
            p.sent_now();
        }
    }
}

impl Drop for Lesson {
    fn drop(&mut self) {
        if let Some(p) = &self.prefill {
            p.finish();
        }
        if self.links.is_empty() {
            return;
        }
        let mut map = self.teaching.lock();
        for &link in self.links.iter() {
            if let Some(t) = map.get_mut(&(self.slot, link)) {
                t.lessons -= 1;
                if t.lessons == 0 {
                    map.remove(&(self.slot, link));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_in_flight_while_any_lesson_teaches_it_to_that_pod() {
        let t = Teaching::new();
        let a = t.start(1, &[10, 11, 12], None);
        let b = t.start(1, &[12, 13], None);
        let other_pod = t.start(2, &[20], None);
        assert!(t.in_flight(1, 10) && t.in_flight(1, 12) && t.in_flight(1, 13));
        assert!(!t.in_flight(2, 10), "another pod's lesson");
        assert!(t.in_flight(2, 20));
        drop(a);
        assert!(!t.in_flight(1, 10));
        assert!(t.in_flight(1, 12), "b still teaches it");
        drop(b);
        drop(other_pod);
        assert!(t.is_empty(), "nothing left behind");
        // Nothing new to teach registers nothing.
        let none = t.start(1, &[], Some(Reusable::AtFirstToken));
        assert!(t.is_empty());
        drop(none);
    }

    #[test]
    fn a_long_chain_registers_its_first_links_only() {
        let t = Teaching::new();
        let links: Vec<u64> = (0..(MAX_LINKS as u64 + 10)).collect();
        let lesson = t.start(0, &links, None);
        assert_eq!(t.len(), MAX_LINKS);
        assert!(t.in_flight(0, MAX_LINKS as u64 - 1));
        assert!(!t.in_flight(0, MAX_LINKS as u64));
        drop(lesson);
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn a_streamed_lesson_is_waited_for_until_its_first_token_or_its_end() {
        let t = Teaching::new();
        // A non-streamed answer says nothing until it ends: nobody waits for it.
        let quiet = t.start(1, &[10, 11], None);
        assert!(t.in_flight(1, 11));
        assert!(t.prefill_in_progress(1, 11).is_none());
        // A streamed one is waited for on its pod only, until its first token.
        let first = t.start(1, &[11, 12], Some(Reusable::AtFirstToken));
        let wait = t
            .prefill_in_progress(1, 11)
            .expect("a streamed prefill in progress");
        assert!(t.prefill_in_progress(2, 11).is_none(), "another pod");
        let waiter =
            tokio::spawn(async move { matches!(wait.done().await, WaitEnd::Reusable(None)) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        first.prefilled();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the first token ends the wait")
            .map(|no_turn| assert!(no_turn, "every waiter goes at once"))
            .unwrap();
        assert!(t.prefill_in_progress(1, 12).is_none(), "prefilled");
        assert!(t.in_flight(1, 12), "still taught until the answer ends");
        // A lesson that ends without a first token (failed, abandoned) ends the wait too.
        let failed = t.start(1, &[20], Some(Reusable::AtFirstToken));
        let wait = t.prefill_in_progress(1, 20).unwrap();
        drop(failed);
        wait.done().await;
        assert!(t.prefill_in_progress(1, 20).is_none());
        drop((quiet, first));
        assert!(t.is_empty());
    }

    /// The turn a slot waiter got, if it got one.
    fn turn(end: WaitEnd) -> Option<SlotTurn> {
        match end {
            WaitEnd::Reusable(turn) => turn,
            WaitEnd::Recompute => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_held_prompt_is_reused_by_one_waiter_per_answer_end() {
        use std::time::Duration;
        let t = Teaching::new();
        let first = t.start(1, &[30, 31], Some(Reusable::AtAnswerEnd));
        let wait = || t.prefill_in_progress(1, 31).expect("in progress");
        let (a, b, gives_up) = (wait(), wait(), wait());
        assert_eq!(a.reusable(), Reusable::AtAnswerEnd);
        let a = tokio::spawn(async move { turn(a.done().await) });
        tokio::task::yield_now().await;
        let b = tokio::spawn(async move { turn(b.done().await) });
        tokio::task::yield_now().await;
        // A waiter that gives up leaves the queue without taking a turn.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), gives_up.done())
                .await
                .is_err()
        );
        // The prompt took 2 s to compute (the 10 ms above included).
        tokio::time::sleep(Duration::from_millis(1990)).await;
        first.prefilled();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!a.is_finished(), "the slot is busy until the answer ends");
        drop(first);
        assert!(
            t.prefill_in_progress(1, 31).is_none(),
            "reusable: newcomers go"
        );
        let a_turn = a.await.unwrap().expect("a turn at the slot");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!b.is_finished(), "one waiter per end");
        drop(a_turn);
        assert!(
            b.await.unwrap().is_some(),
            "the first waiter's end lets the next go"
        );
        assert!(t.is_empty());
    }

    /// A long answer keeps the slot busy: a waiter computes the prompt again once waiting has
    /// cost as long as computing it did (the first token came 1 s after the lesson began).
    #[tokio::test(start_paused = true)]
    async fn a_waiter_stops_when_the_slot_stays_busy_as_long_as_computing_took() {
        use std::time::Duration;
        let t = Teaching::new();
        let long_answer = t.start(1, &[40], Some(Reusable::AtAnswerEnd));
        let waiter = t.prefill_in_progress(1, 40).unwrap();
        let started = Instant::now();
        let waiter = tokio::spawn(async move { waiter.done().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        long_answer.prefilled();
        let end = waiter.await.unwrap();
        assert!(matches!(end, WaitEnd::Recompute), "{end:?}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100));
        // A lesson whose request waited 5 s before it left: its prompt's time starts then.
        let late = t.start(1, &[42], Some(Reusable::AtAnswerEnd));
        tokio::time::sleep(Duration::from_secs(5)).await;
        late.sent_now();
        let waiter = t.prefill_in_progress(1, 42).unwrap();
        let started = Instant::now();
        let waiter = tokio::spawn(async move { waiter.done().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        late.prefilled();
        assert!(matches!(waiter.await.unwrap(), WaitEnd::Recompute));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100));
        drop(late);
        // Before the first token nothing says how long computing takes: only the lesson's end
        // (or the proxy's limit) ends the wait.
        let failed = t.start(1, &[41], Some(Reusable::AtAnswerEnd));
        let waiter = t.prefill_in_progress(1, 41).unwrap();
        let waiter = tokio::spawn(async move { waiter.done().await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiter.is_finished());
        drop(failed);
        assert!(turn(waiter.await.unwrap()).is_some());
        drop(long_answer);
        assert!(t.is_empty());
    }
}
