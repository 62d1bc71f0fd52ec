//! The per-pod signal store: the last engine load report of each pod, per source, so a pick
//! can read the pod's whole load.
//!
//! A pod's load is `max(node in flight, this process's requests on it now + the other nodes'
//! part)` over its fresh reports: the node-local count alone sees only this node's share of
//! the pod (about 1/N of it with N proxies), the engine's count sees everyone's but ages. A
//! report's count minus this process's requests on the pod when it was asked for is what the
//! other nodes had then; [`super::others`] predicts it forward (the sample while young, the
//! pod's running average of samples as it ages), and this process's own requests are counted
//! as they are now, in both directions: requests it started since add, requests of its own
//! that ended since take away. A report past its freshness stands for nothing, and the
//! estimate is never below the node-local count.
//!
//! Each pod keeps one report per [`Source`]: vLLM's in-band report has no running count, so it
//! must not replace the scraped one that has. Reads are on the pick path, so they are a few
//! relaxed loads: each report is a seqlock of plain atomics (a read that races a write retries,
//! a write that races another write is dropped, the other is as fresh), no lock, no clock read
//! (`now` is passed in). Pods are addressed by their gauge [`Slot`].
//!
//! The default freshness, [`DEFAULT_STALENESS`] = 30 s. The estimate stays unbiased as a
//! report ages: only the other nodes' changes since are unseen, and they go both ways (they
//! start requests and theirs end). The node-local count
//! alone, what stands once the report is dropped, under-counts by the fleet's size. So a report
//! counts as long as it is the best view there is, and the newest report replaces it: a pod
//! that answers this node refreshes it with every response, one that does not is scraped (see
//! `super::scrape`). Replays of a fleet of 4 and 8 routers measured it (docs/routing-quality.md):
//! at 2 s, cache-aware kept 0.84x the limit's hits with 4 routers and 0.71x with 8, at 30 s
//! 0.95x with both.
//!
//! What a report says of the pod's queue (waiting requests, KV-cache use) ages differently: it
//! makes the pod full for admission, and a full pod gets no request from this node, so no
//! response refreshes the report. It counts for [`QUEUE_STATE_FRESHNESS`] only; then the pod
//! takes a request again, whose answer reports the queue anew.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::others::{self, NO_MEAN};
use super::report::{EngineReport, Source};
use super::slot_prompts::SlotPromptViews;
use crate::load::userspace::UserspaceGauge;
use crate::load::{LoadGauge, Slot, MAX_SLOTS};
use crate::vocab::EngineKind;

/// How long a report counts, unless its source says otherwise.
pub const DEFAULT_STALENESS: Duration = Duration::from_secs(30);

/// How long a report's queue (waiting, KV-cache use) can make its pod full.
pub const QUEUE_STATE_FRESHNESS: Duration = Duration::from_secs(2);

/// A field the report did not carry.
const ABSENT: u64 = u64::MAX;

/// One report, as a seqlock: `seq` is odd while a write is in progress and 0 before the first.
#[derive(Debug, Default)]
struct Record {
    seq: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    kv_bits: AtomicU64,
    /// `ABSENT` once the slot was reset.
    at_ns: AtomicU64,
    fresh_until_ns: AtomicU64,
    /// This process's requests in flight on the pod when the report was asked for.
    local_at: AtomicU64,
}

/// A consistent read of a [`Record`].
#[derive(Debug, Clone, Copy)]
struct Snap {
    running: Option<u64>,
    waiting: Option<u64>,
    kv: Option<f64>,
    at_ns: u64,
    fresh_until_ns: u64,
    local_at: u64,
}

impl Snap {
    fn fresh(&self, now_ns: u64) -> bool {
        now_ns < self.fresh_until_ns
    }

    /// The pod's load now: this process's requests on it (`local`) and the other nodes'
    /// part, predicted from this report's sample of it and the pod's running average `mean`;
    /// `None` without a request count.
    fn estimate(&self, local: u64, mean: u64, now_ns: u64) -> Option<u64> {
        let others = self.others()?;
        let age = now_ns.saturating_sub(self.at_ns);
        Some(local.saturating_add(others::predict(others, mean, age)))
    }

    /// The other nodes' requests on the pod at the report: its count less this process's
    /// then.
    fn others(&self) -> Option<u64> {
        others_at(self.running, self.waiting, self.local_at)
    }
}

/// A report's count less this process's requests on the pod when it was asked for; `None`
/// without a count.
fn others_at(running: Option<u64>, waiting: Option<u64>, local_at: u64) -> Option<u64> {
    if running.is_none() && waiting.is_none() {
        return None;
    }
    let engine = running.unwrap_or(0).saturating_add(waiting.unwrap_or(0));
    Some(engine.saturating_sub(local_at))
}

fn opt(v: u64) -> Option<u64> {
    (v != ABSENT).then_some(v)
}

impl Record {
    /// Write `values` unless another write is in progress (then that one wins): `false`.
    fn write(&self, values: [u64; 6]) -> bool {
        let s = self.seq.load(Relaxed);
        if s & 1 == 1
            || self
                .seq
                .compare_exchange(s, s + 1, Acquire, Relaxed)
                .is_err()
        {
            return false;
        }
        fence(Release);
        let [running, waiting, kv_bits, at_ns, fresh_until_ns, local_at] = values;
        self.running.store(running, Relaxed);
        self.waiting.store(waiting, Relaxed);
        self.kv_bits.store(kv_bits, Relaxed);
        self.at_ns.store(at_ns, Relaxed);
        self.fresh_until_ns.store(fresh_until_ns, Relaxed);
        self.local_at.store(local_at, Relaxed);
        self.seq.store(s + 2, Release);
        true
    }

    fn read(&self) -> Option<Snap> {
        for _ in 0..8 {
            let s1 = self.seq.load(Acquire);
            if s1 == 0 {
                return None;
            }
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let snap = Snap {
                running: opt(self.running.load(Relaxed)),
                waiting: opt(self.waiting.load(Relaxed)),
                kv: opt(self.kv_bits.load(Relaxed)).map(f64::from_bits),
                at_ns: self.at_ns.load(Relaxed),
                fresh_until_ns: self.fresh_until_ns.load(Relaxed),
                local_at: self.local_at.load(Relaxed),
            };
            fence(Acquire);
            if self.seq.load(Relaxed) == s1 {
                return (snap.at_ns != ABSENT).then_some(snap);
            }
        }
        None
    }
}

/// Everything kept for one pod, on its own cache lines.
#[derive(Debug)]
#[repr(align(64))]
struct PodSignals {
    /// By [`Source::index`].
    reports: [Record; 2],
    /// The running average of the other nodes' part over the reports with a running count,
    /// thousandths of a request ([`NO_MEAN`] before the first).
    others_mean: AtomicU64,
    /// The pod's metrics page last read as llama.cpp's: its prompt cache is per slot.
    slot_cache: AtomicBool,
}

impl Default for PodSignals {
    fn default() -> Self {
        Self {
            reports: Default::default(),
            others_mean: AtomicU64::new(NO_MEAN),
            slot_cache: AtomicBool::new(false),
        }
    }
}

/// When and against which count a report was asked for (see [`SignalStore::stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub source: Source,
    at_ns: u64,
    local: u64,
}

/// Engine signals of every pod slot.
#[derive(Debug)]
pub struct SignalStore {
    epoch: Instant,
    staleness: Duration,
    pods: Box<[PodSignals]>,
    /// This process's requests in flight per pod.
    local: Arc<UserspaceGauge>,
    /// What llama.cpp pods say their slots hold.
    prompts: SlotPromptViews,
}

impl SignalStore {
    /// A store whose reports count for `staleness` (in-band; the scraper sets its own), over
    /// `local`, this process's requests in flight per pod (what it adds to a report's count
    /// as they change).
    pub fn new(staleness: Duration, local: Arc<UserspaceGauge>) -> Self {
        Self {
            epoch: Instant::now(),
            staleness,
            pods: (0..MAX_SLOTS).map(|_| PodSignals::default()).collect(),
            local,
            prompts: SlotPromptViews::default(),
        }
    }

    /// What llama.cpp pods say their slots hold (see [`super::slot_prompts`]).
    pub fn prompts(&self) -> &SlotPromptViews {
        &self.prompts
    }

    /// How long an in-band report counts.
    pub fn staleness(&self) -> Duration {
        self.staleness
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(ABSENT - 1)
    }

    /// `report` arrived at `at` (an in-band header, read as the response head came): it counts
    /// for the store's staleness limit.
    pub fn report(&self, slot: Slot, report: &EngineReport, source: Source, at: Instant) {
        self.record(slot, report, self.stamp(slot, source, at), self.staleness);
    }

    /// Stamp a report about to be asked for (the scraper, before its request): requests this
    /// node starts from now on count on top of it.
    pub fn stamp(&self, slot: Slot, source: Source, at: Instant) -> Stamp {
        Stamp {
            source,
            at_ns: self.ns(at),
            local: self.local.active(slot),
        }
    }

    /// The engine kind the pod's metrics page was read as.
    pub fn note_engine(&self, slot: Slot, kind: EngineKind) {
        if let Some(p) = self.pods.get(slot as usize) {
            p.slot_cache.store(kind == EngineKind::LlamaCpp, Relaxed);
        }
    }

    /// Whether the pod's engine was read as one that keeps a prompt's cache in the slot that
    /// computed it (llama.cpp's server): another request reuses it only once that slot is
    /// free, where vLLM and SGLang share a prefix as soon as it is computed.
    pub fn caches_per_slot(&self, slot: Slot) -> bool {
        self.pods
            .get(slot as usize)
            .is_some_and(|p| p.slot_cache.load(Relaxed))
    }

    /// Keep `report`, taken at `stamp`, for `valid_for`. An empty report changes nothing.
    pub fn record(&self, slot: Slot, report: &EngineReport, stamp: Stamp, valid_for: Duration) {
        let Some(p) = self.pods.get(slot as usize) else {
            return;
        };
        if report.is_empty() {
            return;
        }
        let valid = u64::try_from(valid_for.as_nanos()).unwrap_or(ABSENT);
        // A report with no running count (vLLM's in-band one) is no sample of the whole load.
        if report.running.is_some() {
            if let Some(sample) = others_at(report.running, report.waiting, stamp.local) {
                let _ = p
                    .others_mean
                    .fetch_update(Relaxed, Relaxed, |m| Some(others::next_mean(m, sample)));
            }
        }
        let _ = p.reports[stamp.source.index()].write([
            report.running.unwrap_or(ABSENT),
            report.waiting.unwrap_or(ABSENT),
            report.kv_usage.map_or(ABSENT, f64::to_bits),
            stamp.at_ns,
            stamp.at_ns.saturating_add(valid).min(ABSENT - 1),
            stamp.local,
        ]);
    }

    /// The pod's load: `max(node_in_flight, this process's requests on it + the other nodes'
    /// part predicted from its newest fresh report with a running count)`, else
    /// `node_in_flight`. The newest,
    /// not the highest: an older report describes a state the newer one replaced. (A report
    /// without a running count, such as vLLM's in-band one, says only what waits.)
    #[inline]
    pub fn load(&self, slot: Slot, node_in_flight: u64, now: Instant) -> u64 {
        let Some(p) = self.pods.get(slot as usize) else {
            return node_in_flight;
        };
        let reports = [&p.reports[0], &p.reports[1]].map(Record::read);
        if reports.iter().all(Option::is_none) {
            // No engine report (yet, or at all): no clock to read.
            return node_in_flight;
        }
        let now_ns = self.ns(now);
        let local = self.local.active(slot);
        let [a, b] = reports.map(|r| r.filter(|s| s.fresh(now_ns) && s.running.is_some()));
        let newest = match (a, b) {
            (Some(a), Some(b)) => Some(if a.at_ns >= b.at_ns { a } else { b }),
            (a, b) => a.or(b),
        };
        let mean = p.others_mean.load(Relaxed);
        let newest = newest.and_then(|s| s.estimate(local, mean, now_ns));
        newest.map_or(node_in_flight, |e| e.max(node_in_flight))
    }

    /// A fresh report says the pod queues more than `waiting_limit` requests or uses more than
    /// `kv_limit` of its KV cache (the freshest report carrying each field decides).
    pub fn is_full(&self, slot: Slot, now: Instant, waiting_limit: u64, kv_limit: f64) -> bool {
        let (waiting, kv) = self.queue_state(slot, now);
        waiting.is_some_and(|w| w > waiting_limit) || kv.is_some_and(|k| k > kv_limit)
    }

    /// The pod's waiting requests and KV-cache use, each from the freshest report carrying it
    /// that is younger than [`QUEUE_STATE_FRESHNESS`] (`None` where none is).
    pub fn queue_state(&self, slot: Slot, now: Instant) -> (Option<u64>, Option<f64>) {
        let Some((fresh, now_ns)) = self.fresh(slot, now) else {
            return (None, None);
        };
        let window = u64::try_from(QUEUE_STATE_FRESHNESS.as_nanos()).unwrap_or(u64::MAX);
        let since = now_ns.saturating_sub(window);
        let newest = |field: fn(&Snap) -> bool| {
            fresh
                .iter()
                .flatten()
                .filter(|s| s.at_ns > since && field(s))
                .max_by_key(|s| s.at_ns)
                .copied()
        };
        (
            newest(|s| s.waiting.is_some()).and_then(|s| s.waiting),
            newest(|s| s.kv.is_some()).and_then(|s| s.kv),
        )
    }

    /// Whether the scraper should read the pod's page: no in-band report with both request
    /// counts arrived within `every` (the scraper's interval), so the freshest view of the pod
    /// is never older than one interval whichever source gives it.
    pub fn wants_scrape(&self, slot: Slot, now: Instant, every: Duration) -> bool {
        let Some(p) = self.pods.get(slot as usize) else {
            return false;
        };
        let since = self
            .ns(now)
            .saturating_sub(u64::try_from(every.as_nanos()).unwrap_or(u64::MAX));
        !p.reports[Source::InBand.index()]
            .read()
            .is_some_and(|s| s.at_ns > since && s.running.is_some() && s.waiting.is_some())
    }

    /// The pod's fresh reports and the time they were judged at; `None` when the slot is past
    /// capacity or the pod never reported (the common case without engine signals, which then
    /// reads no clock).
    fn fresh(&self, slot: Slot, now: Instant) -> Option<([Option<Snap>; 2], u64)> {
        let p = self.pods.get(slot as usize)?;
        let reports = [&p.reports[0], &p.reports[1]].map(Record::read);
        if reports.iter().all(Option::is_none) {
            return None;
        }
        let now_ns = self.ns(now);
        Some((reports.map(|r| r.filter(|s| s.fresh(now_ns))), now_ns))
    }

    /// The pod's signals with their ages, for `/debug/routing` and metrics; `None` for a slot
    /// past capacity.
    pub fn snapshot(&self, slot: Slot, now: Instant) -> Option<SignalView> {
        let p = self.pods.get(slot as usize)?;
        let now_ns = self.ns(now);
        let local = self.local.active(slot);
        let view = |source: Source| {
            p.reports[source.index()].read().map(|s| ReportView {
                running: s.running,
                waiting: s.waiting,
                kv_usage: s.kv,
                age_seconds: now_ns.saturating_sub(s.at_ns) as f64 / 1e9,
                fresh: s.fresh(now_ns),
                in_flight_here_then: s.local_at,
            })
        };
        let mean = p.others_mean.load(Relaxed);
        Some(SignalView {
            in_flight_here: local,
            others_average: (mean != NO_MEAN).then(|| mean as f64 / 1000.0),
            inband: view(Source::InBand),
            scrape: view(Source::Scrape),
        })
    }

    /// The slot now holds another pod: its reports are forgotten.
    pub fn reset(&self, slot: Slot) {
        if let Some(p) = self.pods.get(slot as usize) {
            for r in &p.reports {
                // Unlike a report, forgetting must not lose to a concurrent write.
                while !r.write([ABSENT; 6]) {
                    std::hint::spin_loop();
                }
            }
            p.others_mean.store(NO_MEAN, Relaxed);
        }
        self.prompts.set(slot, None);
    }
}

/// One pod's signals, as `/debug/routing` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SignalView {
    /// This process's requests in flight on the pod.
    pub in_flight_here: u64,
    /// The running average of the other nodes' requests on the pod over its reports (what an
    /// aged report's sample gives way to), requests.
    pub others_average: Option<f64>,
    pub inband: Option<ReportView>,
    pub scrape: Option<ReportView>,
}

/// One report and its age.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReportView {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_usage: Option<f64>,
    pub age_seconds: f64,
    /// Still within its freshness (it counts in the pod's load).
    pub fresh: bool,
    /// This process's requests in flight on the pod when the report was asked for (what it
    /// has added or taken since moves the report's count).
    pub in_flight_here_then: u64,
}

#[cfg(test)]
mod tests;
