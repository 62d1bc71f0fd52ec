//! A prompt another proxy's request is computing on a llama.cpp pod, seen in the pod's slot
//! view ([`crate::signals::slot_prompts`]).
//!
//! Why: a proxy waits for the prefills of its own requests (see [`super::teaching`]), but in a
//! fleet the request computing a prompt is as often another proxy's. llama.cpp keeps a prompt
//! in the slot that computes it, busy until its answer ends, so a request for the same prompt
//! sent meanwhile takes the pod's other slot and computes the prompt again beside the first:
//! both share the pod's compute and both finish late (three proxies in front of three
//! llama.cpp servers, hot prompt: when a server first got the prompt, the two requests that
//! computed it side by side had their first token after 17 s, where one alone had it after
//! 8.7 s, and the requests queued behind them waited as long).
//!
//! A request whose pod shows its prompt only in a slot that is still computing it waits, at
//! most `--cache-aware-prefill-wait`, until a later read of the page shows the slot free (it
//! then holds the prompt for the waiter), or the view is gone. As for a proxy's own prefills,
//! the waiter stops once the slot has been answering for as long as it saw the slot compute:
//! computing the prompt again costs no more from then on.

use std::time::{Duration, Instant};

use crate::keys::chain::PromptChain;
use crate::load::Slot;
use crate::metrics::handles::PrefillWait;
use crate::signals::slot_prompts::{PodPrompts, SlotPromptViews, SlotState};

/// How often a waiter looks for a new read of the page (the reads themselves come every
/// 0.75 s with three proxies at the default budget).
pub const POLL: Duration = Duration::from_millis(50);

/// What one read of the pod's page says to a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A busy slot still computes the prompt.
    Prefilling,
    /// The slot that computed it is answering.
    Answering,
    /// No busy slot holds it alone while another is free: a free slot holds it, the pod
    /// forgot it, or no slot is free any more (the server then queues the request and gives it
    /// the first slot to free, as a wait would).
    Free,
    /// The pod has no fresh view.
    Gone,
}

/// What the pod's view says of the request's prompt.
pub fn seen(view: Option<&PodPrompts>, chain: &PromptChain) -> Seen {
    let Some(view) = view else {
        return Seen::Gone;
    };
    match view.computing(chain).map(|c| c.state) {
        None | Some(SlotState::Idle) => Seen::Free,
        Some(SlotState::Prefilling) => Seen::Prefilling,
        Some(SlotState::Answering) => Seen::Answering,
    }
}

/// A waiter's state across reads.
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    started: Instant,
    /// When a read first showed the slot answering.
    answering_since: Option<Instant>,
}

impl Waiter {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            answering_since: None,
        }
    }

    /// The wait's end after a read that says `seen` at `now`, or `None` to go on waiting.
    /// `seen` is `None` when no new read came since the last step.
    pub fn step(&mut self, seen: Option<Seen>, now: Instant) -> Option<PrefillWait> {
        match seen {
            Some(Seen::Free) => return Some(PrefillWait::Prefilled),
            Some(Seen::Gone) => return Some(PrefillWait::Recompute),
            Some(Seen::Answering) => {
                self.answering_since.get_or_insert(now);
            }
            Some(Seen::Prefilling) | None => {}
        }
        let since = self.answering_since?;
        let computing = since.saturating_duration_since(self.started);
        (now.saturating_duration_since(since) >= computing).then_some(PrefillWait::Recompute)
    }
}

/// Wait, at most `limit`, until the pod in `slot` no longer shows `chain`'s prompt only in a
/// busy slot; how the wait ended.
pub async fn wait(
    views: &SlotPromptViews,
    slot: Slot,
    chain: &PromptChain,
    limit: Duration,
) -> PrefillWait {
    let started = Instant::now();
    let mut waiter = Waiter::new(started);
    let mut last_read = views.get(slot, started).map(|v| v.read_at());
    loop {
        tokio::time::sleep(POLL).await;
        let now = Instant::now();
        if now.saturating_duration_since(started) >= limit {
            return PrefillWait::Timeout;
        }
        let view = views.get(slot, now);
        let read_at = view.as_ref().map(|v| v.read_at());
        let news = (read_at != last_read).then(|| seen(view.as_deref(), chain));
        last_read = read_at;
        if let Some(end) = waiter.step(news, now) {
            return end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_goes_when_the_slot_frees_and_stops_when_it_answers_as_long_as_it_computed() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Waiter::new(t0);
        assert_eq!(w.step(Some(Seen::Prefilling), at(700)), None);
        assert_eq!(w.step(None, at(750)), None, "no new read");
        assert_eq!(
            w.step(Some(Seen::Free), at(1400)),
            Some(PrefillWait::Prefilled)
        );

        // Computing seen for 2 s, answering from then on: the waiter gives up 2 s later.
        let mut w = Waiter::new(t0);
        assert_eq!(w.step(Some(Seen::Prefilling), at(1000)), None);
        assert_eq!(w.step(Some(Seen::Answering), at(2000)), None);
        assert_eq!(w.step(None, at(3900)), None);
        assert_eq!(w.step(None, at(4000)), Some(PrefillWait::Recompute));

        // The slot was freed or the view went away: go.
        let mut w = Waiter::new(t0);
        assert_eq!(w.step(Some(Seen::Answering), at(500)), None);
        assert_eq!(
            w.step(Some(Seen::Free), at(800)),
            Some(PrefillWait::Prefilled)
        );
        let mut w = Waiter::new(t0);
        assert_eq!(
            w.step(Some(Seen::Gone), at(800)),
            Some(PrefillWait::Recompute)
        );
    }
}
