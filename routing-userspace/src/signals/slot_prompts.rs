//! What a llama.cpp pod holds, in its own words: the prompt text of each slot, read from its
//! `/slots` page, reduced to content anchors ([`crate::keys::anchors`]).
//!
//! Why: the proxies of a fleet each index only what they sent. With many prefixes per pod the
//! hash spreads them evenly and every proxy agrees; with a few long documents per pod it does
//! not (six documents hashed over three pods fall two to a pod only one time in eight), and a
//! proxy that placed a document elsewhere leaves the others to look for it at the hash's pod.
//! A pod's own list of the prompts it holds is the one view every proxy shares: with it a
//! proxy finds a document another proxy placed, and places a new one where the pods hold
//! least (see [`crate::balance::cache_aware`]). The page also says which slots are busy, so a
//! request can wait for a prompt another proxy's request is still computing there
//! ([`crate::router::other_prefill`]).
//!
//! llama.cpp's server shows each slot's prompt in `/slots` when started with
//! `LLAMA_SERVER_SLOTS_DEBUG=1` (without it, only counts: [`Parsed::NoPrompts`], and the
//! pod is routed as before). Only fingerprints are kept, never the text. A view counts for as
//! long as a scraped report does; this proxy's own sends to the pod since the read are added
//! to it, as the load estimate adds its requests. A prompt that leaves the slots is not gone:
//! llama.cpp saves a slot's prompt to its host prompt cache when the slot takes another, and
//! restores it for the next request that starts with it. So a view also keeps, for
//! [`REMEMBERED`], the prompts the pod's earlier reads showed (at most [`MAX_REMEMBERED`]): a
//! proxy that never sent a document still finds it there after its slot moved on. A pod whose
//! page cannot be read (a restart) loses all of it.
//!
//! The page is untrusted: read with the scraper's size and time caps, parsed as JSON, and cut
//! to [`MAX_SLOTS_READ`] slots of [`MAX_PROMPT_CHARS`] each; at worst it changes this pod's
//! view.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};

use crate::keys::anchors::{held_chars, SlotAnchors};
use crate::keys::canonical::normalize;
use crate::keys::chain::{PromptChain, CUT_CHARS};
use crate::load::{Slot, MAX_SLOTS};
use crate::router::inflow::UNITS_PER_LINK;

/// The page's path on a llama.cpp server.
pub const SLOTS_PATH: &str = "/slots";

/// Slots of one pod read at most.
pub const MAX_SLOTS_READ: usize = 256;

/// Characters of one slot's prompt read at most (the rest is not anchored).
pub const MAX_PROMPT_CHARS: usize = 1 << 20;

/// How long a prompt that left the pod's slots still counts as held.
pub const REMEMBERED: Duration = Duration::from_secs(120);

/// Prompts that left the slots kept per pod, newest first.
pub const MAX_REMEMBERED: usize = 16;

/// Anchors that name a prompt by its beginning (about 550 bytes): a slot that shows the same
/// beginning again holds the same prompt (another question on the same document).
const HEAD_ANCHORS: usize = 64;

/// One slot as the page lists it (other fields are ignored).
#[derive(Debug, Deserialize)]
struct SlotEntry<'a> {
    #[serde(default)]
    id_task: Option<i64>,
    #[serde(default, borrow)]
    prompt: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    is_processing: bool,
    #[serde(default)]
    next_token: Option<NextTokens>,
}

/// A slot's `next_token`: one object, or a list of them (the xllamacpp build the real-llm bench
/// runs sends a list).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NextTokens {
    One(NextToken),
    Many(Vec<NextToken>),
}

#[derive(Debug, Deserialize)]
struct NextToken {
    #[serde(default)]
    n_decoded: u64,
}

impl NextTokens {
    fn decoded(&self) -> bool {
        match self {
            Self::One(t) => t.n_decoded > 0,
            Self::Many(ts) => ts.iter().any(|t| t.n_decoded > 0),
        }
    }
}

/// What a slot is doing with its prompt when read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SlotState {
    /// Holds the prompt, free for the next request that starts with it.
    #[default]
    Idle,
    /// Computing the prompt: nothing reuses it until the answer ends.
    Prefilling,
    /// Answering after the prompt (its first token is out), busy until the answer ends.
    Answering,
}

/// A prompt the pod holds only in a busy slot (see [`PodPrompts::computing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Computing {
    /// Leading links of the chain the busy slot holds.
    pub depth: u32,
    pub state: SlotState,
}

/// What a `/slots` page says.
#[derive(Debug)]
pub enum Parsed {
    /// The slots' prompts (an empty list when no slot has run a task yet), and the slots that
    /// hold none and run nothing.
    Prompts(Vec<Arc<SlotPrompt>>, usize),
    /// A slot ran a task and its prompt is not shown: the server runs without
    /// `LLAMA_SERVER_SLOTS_DEBUG`.
    NoPrompts,
}

/// Why a page gave nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotsError {
    #[error("not a JSON list of slots: {0}")]
    Invalid(String),
}

/// One slot's prompt, as anchors.
#[derive(Debug, Clone, Default)]
pub struct SlotPrompt {
    anchors: SlotAnchors,
    /// Normalized characters of the prompt.
    chars: u64,
    /// The hash of its first anchors (see [`HEAD_ANCHORS`]).
    head: u64,
    state: SlotState,
}

impl SlotPrompt {
    /// The anchors of `text` (normalized here), up to [`MAX_PROMPT_CHARS`] of it.
    pub fn of(text: &str) -> Self {
        let text = crate::keys::canonical::cut(text, MAX_PROMPT_CHARS);
        let normalized = normalize(text);
        let anchors = SlotAnchors::of(&normalized);
        Self {
            head: anchors.head(HEAD_ANCHORS),
            anchors,
            chars: normalized.chars().count() as u64,
            state: SlotState::Idle,
        }
    }

    /// The same prompt, in a slot doing `state`.
    pub fn in_state(self, state: SlotState) -> Self {
        Self { state, ..self }
    }

    /// The leading links of `chain` this prompt holds: those within the run of the chain's
    /// anchors the prompt has in the same order (see [`held_chars`]).
    fn depth(&self, chain: &PromptChain) -> u32 {
        let held = held_chars(chain.anchors(), &self.anchors);
        u32::try_from(chain.links_within(u64::from(held))).unwrap_or(u32::MAX)
    }
}

/// Parse a `/slots` page.
pub fn parse_slots(page: &[u8]) -> Result<Parsed, SlotsError> {
    let slots: Vec<SlotEntry<'_>> =
        serde_json::from_slice(page).map_err(|e| SlotsError::Invalid(e.to_string()))?;
    let mut prompts = Vec::new();
    let mut empty = 0;
    for s in slots.iter().take(MAX_SLOTS_READ) {
        match (&s.prompt, s.id_task) {
            (Some(p), _) => {
                let state = match (s.is_processing, &s.next_token) {
                    (false, _) => SlotState::Idle,
                    (true, Some(t)) if t.decoded() => SlotState::Answering,
                    (true, _) => SlotState::Prefilling,
                };
                prompts.push(Arc::new(SlotPrompt::of(p).in_state(state)));
            }
            (None, Some(_)) => return Ok(Parsed::NoPrompts),
            (None, None) => empty += 1,
        }
    }
    Ok(Parsed::Prompts(prompts, empty))
}

/// One pod's view: its slots' prompts when read, and what this proxy sent it since.
#[derive(Debug)]
pub struct PodPrompts {
    slots: Vec<Arc<SlotPrompt>>,
    /// Prompts earlier reads showed that the slots no longer do, with when they were last
    /// seen, newest first.
    remembered: Vec<(Arc<SlotPrompt>, Instant)>,
    read_at: Instant,
    fresh_until: Instant,
    /// New links this proxy sent the pod since the read.
    sent_since: AtomicU64,
    /// Slots that held no prompt and ran nothing when read.
    empty_slots: usize,
}

impl PodPrompts {
    pub fn new(slots: Vec<Arc<SlotPrompt>>, read_at: Instant, valid_for: Duration) -> Self {
        Self {
            slots,
            remembered: Vec::new(),
            read_at,
            fresh_until: read_at + valid_for,
            sent_since: AtomicU64::new(0),
            empty_slots: 0,
        }
    }

    /// The view, with `n` slots that held no prompt and ran nothing.
    pub fn with_empty_slots(self, n: usize) -> Self {
        Self {
            empty_slots: n,
            ..self
        }
    }

    /// The view a read of `slots` gives, after `previous`: what left the slots since is
    /// remembered (see the module docs).
    pub fn after(
        previous: Option<&PodPrompts>,
        slots: Vec<Arc<SlotPrompt>>,
        read_at: Instant,
        valid_for: Duration,
    ) -> Self {
        let mut view = Self::new(slots, read_at, valid_for);
        let Some(previous) = previous else {
            return view;
        };
        let left = previous
            .slots
            .iter()
            .map(|s| (s, previous.read_at))
            .chain(previous.remembered.iter().map(|(s, at)| (s, *at)));
        for (s, seen) in left {
            let shown = |p: &Arc<SlotPrompt>| p.head == s.head;
            if read_at.saturating_duration_since(seen) > REMEMBERED
                || view.slots.iter().any(shown)
                || view.remembered.iter().any(|(p, _)| shown(p))
            {
                continue;
            }
            view.remembered.push((Arc::clone(s), seen));
        }
        view.remembered
            .sort_by_key(|&(_, seen)| std::cmp::Reverse(seen));
        view.remembered.truncate(MAX_REMEMBERED);
        view
    }

    pub fn fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    fn prompts(&self) -> impl Iterator<Item = &SlotPrompt> {
        self.slots
            .iter()
            .chain(self.remembered.iter().map(|(s, _)| s))
            .map(|s| &**s)
    }

    /// The leading links of `chain` the pod holds, in a slot or remembered.
    pub fn depth(&self, chain: &PromptChain) -> u32 {
        self.prompts().map(|s| s.depth(chain)).max().unwrap_or(0)
    }

    /// The request's prompt when the pod holds it only in a busy slot while another slot is
    /// free: the busy slot's depth beats every idle slot's and remembered prompt's by more than
    /// [`TIE_LINKS`](crate::balance::cache_aware::TIE_LINKS). llama.cpp keeps a prompt in the
    /// slot that computed it: a request sent meanwhile takes the free slot and computes the
    /// prompt again beside the first (see `crate::router::teaching`). With no slot free, the
    /// server queues it and gives it the first slot to free, as it would after a wait.
    pub fn computing(&self, chain: &PromptChain) -> Option<Computing> {
        let mut free = self.empty_slots > 0;
        let mut held = 0;
        let mut busy: Option<Computing> = None;
        for s in &self.slots {
            let depth = s.depth(chain);
            match s.state {
                SlotState::Idle => {
                    free = true;
                    held = held.max(depth);
                }
                state => {
                    if busy.is_none_or(|b| depth > b.depth) {
                        busy = Some(Computing { depth, state });
                    }
                }
            }
        }
        let held = self
            .remembered
            .iter()
            .map(|(s, _)| s.depth(chain))
            .fold(held, u32::max);
        let margin = crate::balance::cache_aware::TIE_LINKS;
        busy.filter(|b| free && held.saturating_add(margin) < b.depth)
    }

    /// When the pod's page was read.
    pub fn read_at(&self) -> Instant {
        self.read_at
    }

    /// What the pod holds, in [`UNITS_PER_LINK`] per link of prompt: its slots' prompts, those
    /// remembered, and what this proxy sent it since. A prompt two slots show (a document two
    /// requests computed side by side) counts once: the pod holds one more document, not two.
    pub fn held_units(&self) -> u64 {
        self.held_units_where(|_| true)
    }

    /// [`Self::held_units`], counting only the prompts whose head `keep` keeps.
    fn held_units_where(&self, keep: impl Fn(u64) -> bool) -> u64 {
        let mut heads = Vec::new();
        let chars: u64 = self
            .prompts()
            .filter(|s| {
                let new = !heads.contains(&s.head);
                heads.push(s.head);
                new && keep(s.head)
            })
            .map(|s| s.chars)
            .sum();
        // Whole links, as the chain counts them: a few hundred characters more or less (a
        // warm-up prompt, a question) must not decide between pods that hold the same
        // documents, or proxies whose views differ by that little would part ways.
        let links = chars / CUT_CHARS as u64;
        links * UNITS_PER_LINK as u64 + self.sent_since.load(Relaxed)
    }

    /// The heads of the prompts the pod holds, in a slot or remembered.
    fn heads(&self) -> impl Iterator<Item = u64> + '_ {
        self.prompts().map(|s| s.head)
    }

    /// This proxy sent the pod `links` links it did not hold.
    pub fn sent(&self, links: usize) {
        let units = (links as f64 * UNITS_PER_LINK) as u64;
        self.sent_since.fetch_add(units, Relaxed);
    }

    pub fn summary(&self, now: Instant) -> PromptsView {
        PromptsView {
            slots: self.slots.len(),
            remembered: self.remembered.len(),
            prompt_chars: self.prompts().map(|s| s.chars).sum(),
            age_seconds: now.saturating_duration_since(self.read_at).as_secs_f64(),
            fresh: self.fresh(now),
            sent_links_since: self.sent_since.load(Relaxed) as f64 / UNITS_PER_LINK,
        }
    }
}

/// What each of `pods` holds that no other of them shows, in the units of
/// [`PodPrompts::held_units`] (plus what this proxy sent it since): where a new prompt costs
/// the fleet least. A pod's slots are all full once it has served as many prompts as it has
/// slots, so what the pods hold stops telling them apart; a new prompt on a pod whose prompts
/// another pod holds too costs no prompt the fleet has only once, wherever the pod's engine
/// makes room for it. (Three proxies, three llama.cpp servers of two slots, every one holding
/// two documents: a proxy placed a new document on the one whose two were held nowhere else,
/// and their questions computed them again three times, run 1796663574.)
pub fn held_alone_units(pods: &[&PodPrompts]) -> Vec<u64> {
    let mut heads: Vec<(u64, usize)> = pods
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.heads().map(move |h| (h, i)))
        .collect();
    heads.sort_unstable();
    heads.dedup();
    let shared: Vec<u64> = heads
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| w[0].0)
        .collect();
    pods.iter()
        .map(|p| p.held_units_where(|h| shared.binary_search(&h).is_err()))
        .collect()
}

/// A pod's view, as `/debug/routing` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptsView {
    /// Slots that showed a prompt.
    pub slots: usize,
    /// Prompts that left the slots, still counted as held.
    pub remembered: usize,
    /// Characters of the prompts in the slots and remembered.
    pub prompt_chars: u64,
    pub age_seconds: f64,
    pub fresh: bool,
    /// New links this proxy sent the pod since the read.
    pub sent_links_since: f64,
}

/// Every pod slot's view; reads are one atomic load.
#[derive(Debug)]
pub struct SlotPromptViews {
    pods: Box<[ArcSwapOption<PodPrompts>]>,
    /// Pods with a view: while none has one (no llama.cpp pod shows its prompts), a request
    /// asks nothing more of them.
    with_view: AtomicUsize,
}

impl Default for SlotPromptViews {
    fn default() -> Self {
        Self {
            pods: (0..MAX_SLOTS).map(|_| ArcSwapOption::empty()).collect(),
            with_view: AtomicUsize::new(0),
        }
    }
}

impl SlotPromptViews {
    pub fn set(&self, slot: Slot, view: Option<PodPrompts>) {
        if let Some(p) = self.pods.get(slot as usize) {
            let added = view.is_some();
            let had = p.swap(view.map(Arc::new)).is_some();
            match (had, added) {
                (false, true) => self.with_view.fetch_add(1, Relaxed),
                (true, false) => self.with_view.fetch_sub(1, Relaxed),
                _ => 0,
            };
        }
    }

    /// Whether any pod has a view, fresh or not.
    pub fn any_pod(&self) -> bool {
        self.with_view.load(Relaxed) > 0
    }

    /// The pod's view while it is fresh.
    pub fn get(&self, slot: Slot, now: Instant) -> Option<Arc<PodPrompts>> {
        let v = self.pods.get(slot as usize)?.load_full()?;
        v.fresh(now).then_some(v)
    }

    /// Whether the pod has a fresh view (no reference taken: the request path asks this of
    /// every pod of a model).
    pub fn has_fresh(&self, slot: Slot, now: Instant) -> bool {
        self.pods
            .get(slot as usize)
            .is_some_and(|p| p.load().as_ref().is_some_and(|v| v.fresh(now)))
    }

    /// The pod's view, fresh or not (`/debug/routing`).
    pub fn any(&self, slot: Slot) -> Option<Arc<PodPrompts>> {
        self.pods.get(slot as usize)?.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::chain::chain_of_json;
    use serde_json::json;

    fn document(seed: u64, words: usize) -> String {
        crate::keys::anchors::prose(seed, words)
    }

    fn chain_of(doc: &str, question: &str) -> (PromptChain, usize) {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": doc},
            {"role": "user", "content": question}]})
        .to_string();
        let c = chain_of_json(&body, true).expect("a chain");
        let n = c.links().len();
        (c, n)
    }

    /// The page llama.cpp serves: its chat template around the messages.
    fn page(prompts: &[Option<&str>]) -> Vec<u8> {
        let slots: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Some(p) => json!({"id": i, "n_ctx": 4096, "is_processing": false, "id_task": i,
                    "params": {"seed": 1}, "prompt": p, "generated": "x"}),
                None => json!({"id": i, "n_ctx": 4096, "is_processing": false}),
            })
            .collect();
        serde_json::to_vec(&slots).unwrap()
    }

    fn rendered(doc: &str, question: &str) -> String {
        format!("<|im_start|>system\n{doc}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    }

    fn view(page_bytes: &[u8]) -> PodPrompts {
        match parse_slots(page_bytes).unwrap() {
            Parsed::Prompts(p, empty) => {
                PodPrompts::new(p, Instant::now(), Duration::from_secs(5)).with_empty_slots(empty)
            }
            Parsed::NoPrompts => panic!("prompts expected"),
        }
    }

    #[test]
    fn a_prompt_only_a_busy_slot_holds_is_being_computed_until_a_free_slot_holds_it() {
        let doc = document(3, 1200);
        let (chain, _) = chain_of(&doc, "Which harbor?");
        // llama.cpp's slot as it computes (no token yet), then as it answers; some servers
        // list `next_token` as an array.
        let slot = |work: Option<(bool, u64)>, p: &str, array: bool| {
            let (busy, decoded) = work.unwrap_or((false, 0));
            let next = json!({"has_next_token": busy, "n_decoded": decoded});
            let next = if array { json!([next]) } else { next };
            json!({"id": 0, "id_task": 7, "is_processing": busy, "next_token": next, "prompt": p})
        };
        let with = |slots: Vec<serde_json::Value>| view(&serde_json::to_vec(&slots).unwrap());
        let prompt = rendered(&doc, "Where is the ledger?");
        let other = rendered(&document(4, 1200), "Other?");
        for array in [false, true] {
            let computing = with(vec![
                slot(Some((true, 0)), &prompt, array),
                slot(None, &other, array),
            ]);
            let c = computing
                .computing(&chain)
                .expect("computed in a busy slot");
            assert_eq!(c.state, SlotState::Prefilling);
            assert!(c.depth >= 3, "{c:?}");
            assert_eq!(computing.depth(&chain), c.depth, "held there all the same");
            // A slot that never ran a task is free too.
            let answering = with(vec![
                slot(Some((true, 5)), &prompt, array),
                json!({"id": 1}),
            ]);
            assert_eq!(
                answering.computing(&chain).unwrap().state,
                SlotState::Answering
            );
        }
        // No slot free: the server queues the request and gives it the first slot to free.
        let full = with(vec![
            slot(Some((true, 0)), &prompt, false),
            slot(Some((true, 0)), &other, false),
        ]);
        assert_eq!(full.computing(&chain), None);
        // The answer ended: the slot is free and holds it; or another, free slot holds it too.
        assert_eq!(
            with(vec![slot(None, &prompt, false)]).computing(&chain),
            None
        );
        let both = with(vec![
            slot(Some((true, 0)), &prompt, false),
            slot(None, &prompt, false),
        ]);
        assert_eq!(both.computing(&chain), None);
        // A prompt the pod does not hold is not being computed there.
        assert_eq!(
            with(vec![slot(Some((true, 0)), &other, false)]).computing(&chain),
            None
        );
    }

    #[test]
    fn a_slot_that_holds_the_document_holds_its_links_through_the_template() {
        let doc = document(1, 1800); // about 11 links
        let (anchors, links) = chain_of(&doc, "What does the ledger say?");
        assert!(links >= 10, "{links}");
        let holder = view(&page(&[
            Some(&rendered(&document(2, 1800), "Other?")),
            Some(&rendered(&doc, "Where is the harbor?")),
        ]));
        // Every link of the document, not the question (another one).
        assert_eq!(holder.depth(&anchors) as usize, links - 1);
        let other = view(&page(&[Some(&rendered(&document(3, 1800), "Q?")), None]));
        assert_eq!(other.depth(&anchors), 0);
        // The same question too: the whole prompt.
        let (same, _) = chain_of(&doc, "Where is the harbor? Tell me all about the harbor now, in detail please, from the document");
        let asked = view(&page(&[Some(&rendered(&doc, "Where is the harbor? Tell me all about the harbor now, in detail please, from the document"))]));
        assert_eq!(asked.depth(&same) as usize, links);
        // White space differs between the request and the rendering: no matter.
        let spaced = view(&page(&[Some(&rendered(&doc.replace(' ', "  "), "Q"))]));
        assert_eq!(spaced.depth(&anchors) as usize, links - 1);
    }

    #[test]
    fn a_pod_holds_its_slots_prompts_and_what_was_sent_since() {
        let doc = document(4, 2000);
        let v = view(&page(&[Some(&doc), None]));
        let links = (doc.len() / CUT_CHARS) as u64;
        assert_eq!(v.held_units(), links * UNITS_PER_LINK as u64);
        // The same document in two slots counts once.
        let twice = view(&page(&[Some(&doc), Some(&doc)]));
        assert_eq!(twice.held_units(), v.held_units());
        v.sent(3);
        assert_eq!(v.held_units(), (links + 3) * UNITS_PER_LINK as u64);
        // A prompt shorter than a link (a warm-up) holds nothing that counts.
        assert_eq!(view(&page(&[Some("Say hello."), None])).held_units(), 0);
        let s = v.summary(Instant::now());
        assert_eq!((s.slots, s.fresh), (1, true));
        assert_eq!(s.sent_links_since, 3.0);
    }

    #[test]
    fn what_a_pod_holds_alone_leaves_out_what_another_pod_shows() {
        let (a, b, c) = (document(1, 2000), document(2, 2000), document(3, 2000));
        let unit = (a.len() / CUT_CHARS) as u64 * UNITS_PER_LINK as u64;
        let pods = [
            view(&page(&[Some(&a), Some(&b)])),
            view(&page(&[Some(&c), None])),
            view(&page(&[Some(&a), Some(&a)])),
        ];
        let refs: Vec<&PodPrompts> = pods.iter().collect();
        // a is on pods 0 and 2: neither holds it alone; b and c are held once.
        assert_eq!(held_alone_units(&refs), vec![unit, unit, 0]);
        // What this proxy sent a pod since counts as its own.
        pods[2].sent(3);
        assert_eq!(held_alone_units(&refs)[2], 3 * UNITS_PER_LINK as u64);
        // A pod alone holds all it holds.
        assert_eq!(held_alone_units(&refs[..1]), vec![pods[0].held_units()]);
    }

    #[test]
    fn a_server_that_hides_prompts_says_so_and_bad_pages_are_errors() {
        // Without LLAMA_SERVER_SLOTS_DEBUG: tasks, no prompt.
        let hidden = json!([{"id": 0, "id_task": 3, "n_prompt_tokens": 40}, {"id": 1}]);
        assert!(matches!(
            parse_slots(hidden.to_string().as_bytes()),
            Ok(Parsed::NoPrompts)
        ));
        // A fresh server: no task yet, nothing held.
        match parse_slots(br#"[{"id":0},{"id":1}]"#) {
            Ok(Parsed::Prompts(p, _)) => assert!(p.is_empty()),
            other => panic!("{other:?}"),
        }
        for bad in [
            &b"{\"slots\": 1}"[..],
            b"[{\"prompt\": 7}]",
            b"not json",
            b"[{\"prompt\": \"\\ud800\"}",
            b"",
        ] {
            assert!(
                parse_slots(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Hostile sizes are cut: more slots than read, a prompt past the cap.
        let many: Vec<_> = (0..MAX_SLOTS_READ + 10)
            .map(|i| json!({"id": i, "id_task": i, "prompt": "p"}))
            .collect();
        match parse_slots(serde_json::to_vec(&many).unwrap().as_slice()) {
            Ok(Parsed::Prompts(p, _)) => assert_eq!(p.len(), MAX_SLOTS_READ),
            other => panic!("{other:?}"),
        }
        let huge = "word ".repeat(MAX_PROMPT_CHARS / 2);
        assert!(SlotPrompt::of(&huge).chars <= MAX_PROMPT_CHARS as u64);
    }

    #[test]
    fn a_prompt_that_left_the_slots_is_remembered_for_a_while() {
        let t0 = Instant::now();
        let valid = Duration::from_secs(5);
        let prompt = |d: u64, q: &str| Arc::new(SlotPrompt::of(&rendered(&document(d, 400), q)));
        let first = PodPrompts::new(vec![prompt(1, "A?"), prompt(2, "B?")], t0, valid);
        // Document 1 asked again (same beginning) and document 3 replaced document 2.
        let t1 = t0 + Duration::from_secs(10);
        let second = PodPrompts::after(
            Some(&first),
            vec![prompt(1, "C?"), prompt(3, "D?")],
            t1,
            valid,
        );
        let s = second.summary(t1);
        assert_eq!(
            (s.slots, s.remembered),
            (2, 1),
            "document 2 remembered, document 1 once"
        );
        let (chain2, links) = chain_of(&document(2, 400), "E?");
        assert_eq!(second.depth(&chain2) as usize, links - 1, "still held");
        // Past REMEMBERED it is gone; a pod without a previous view remembers nothing.
        let t2 = t0 + REMEMBERED + Duration::from_secs(1);
        let third = PodPrompts::after(Some(&second), vec![prompt(4, "F?")], t2, valid);
        assert_eq!(third.depth(&chain2), 0);
        assert_eq!(
            third.summary(t2).remembered,
            2,
            "documents 1 and 3, seen at t1"
        );
        let many: Vec<_> = (10..40).map(|d| prompt(d, "G?")).collect();
        let full = PodPrompts::new(many, t2, valid);
        let after = PodPrompts::after(Some(&full), vec![], t2, valid);
        assert_eq!(after.summary(t2).remembered, MAX_REMEMBERED);
    }

    #[test]
    fn a_view_counts_while_fresh_and_a_slot_can_be_cleared() {
        let views = SlotPromptViews::default();
        let t0 = Instant::now();
        views.set(
            5,
            Some(PodPrompts::new(Vec::new(), t0, Duration::from_secs(2))),
        );
        assert!(views.get(5, t0).is_some() && views.has_fresh(5, t0));
        assert!(views.get(5, t0 + Duration::from_secs(3)).is_none());
        assert!(!views.has_fresh(5, t0 + Duration::from_secs(3)));
        assert!(views.any(5).is_some());
        assert!(views.any_pod());
        views.set(
            5,
            Some(PodPrompts::new(Vec::new(), t0, Duration::from_secs(2))),
        );
        views.set(5, None);
        assert!(views.any(5).is_none() && !views.any_pod());
        assert!(views.get(u16::MAX as Slot, t0).is_none());
    }
}
