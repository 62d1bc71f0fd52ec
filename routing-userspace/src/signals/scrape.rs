//! The scraper: a background task that reads each pod's engine metrics page when no fresh
//! in-band report gives the pod's whole load, and reports what it read to the store.
//!
//! Every proxy of the fleet scrapes every pod, so the load on a pod is the fleet's, not one
//! proxy's: each proxy reads a pod at most once per `fleet size / budget` seconds, so the
//! whole fleet reads it at most `budget` times a second (default 1), whatever its size
//! (10 proxies: each every 10 s; 100 proxies: each every 100 s). A scraped report then counts
//! for that interval (bounded by `max_report_age`, at least the store's staleness), since it is
//! the freshest this proxy will have; past that, the pod is routed by the node-local signals
//! alone, as is a pod whose page cannot be read (logged once per pod, counted per failure,
//! retried less often while it keeps failing). Nothing here is on the request path.
//!
//! Pages are read over the proxy's own HTTP/1.1 client ([`crate::upstream`]) with a connect
//! and a total time cap and a size cap, and parsed as the engine kind of the pod's model.
//!
//! A llama.cpp pod's `/slots` page is read too, when it shows the slots' prompts
//! ([`super::slot_prompts`]), at its own budget ([`ScrapeConfig::slot_prompts_budget`], 4 reads
//! of a pod a second for the whole fleet): a view of what the pods hold is worth having fresh
//! while documents are being placed, and the page costs the engine one pass over its slots. A
//! server that hides the prompts (no `LLAMA_SERVER_SLOTS_DEBUG`) or has no such page is asked
//! again only after [`PROMPTS_RETRY`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use tokio::task::JoinSet;

use super::engine_metrics::{parse_page, PageError, PageReport, MAX_PAGE_BYTES};
use super::metrics::{EngineFamilies, ScrapeMetrics, ScrapeResult, SlotReadResult};
use super::report::Source;
use super::slot_prompts::{parse_slots, Parsed, PodPrompts, SLOTS_PATH};
use super::store::SignalStore;
use crate::load::Slot;
use crate::table::RoutingTable;
use crate::upstream::{
    error_chain, ConnectError, ConnectionHook, PoolKey, SendError, UpBody, Upstream,
    UpstreamOptions,
};
use crate::vocab::EngineKind;

/// Scraper settings.
#[derive(Debug, Clone)]
pub struct ScrapeConfig {
    /// The engines' metrics path.
    pub path: http::uri::PathAndQuery,
    /// Reads of each pod's page per second, for the whole fleet.
    pub budget: f64,
    /// The shortest interval between two reads of one pod by this proxy.
    pub min_interval: Duration,
    /// The longest a scraped report counts.
    pub max_report_age: Duration,
    pub connect_timeout: Duration,
    /// Connect to last byte.
    pub timeout: Duration,
    pub max_page: usize,
    /// Pages read at once.
    pub concurrency: usize,
    /// How often due pods are looked for.
    pub tick: Duration,
    /// Reads of each llama.cpp pod's `/slots` page per second, for the whole fleet (0: never).
    pub slot_prompts_budget: f64,
    /// The size cap of a `/slots` page (it carries every slot's prompt).
    pub max_slots_page: usize,
}

/// How long a pod whose `/slots` page shows no prompts is not asked again.
pub const PROMPTS_RETRY: Duration = Duration::from_secs(600);

impl Default for ScrapeConfig {
    fn default() -> Self {
        Self {
            path: http::uri::PathAndQuery::from_static("/metrics"),
            budget: 1.0,
            min_interval: Duration::from_millis(250),
            max_report_age: Duration::from_secs(60),
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            max_page: MAX_PAGE_BYTES,
            concurrency: 16,
            tick: Duration::from_millis(100),
            slot_prompts_budget: 4.0,
            max_slots_page: 8 << 20,
        }
    }
}

/// This proxy's interval between two reads of one pod: `fleet / budget` seconds, at least
/// `min` (a fleet of 0 counts as 1; a budget of 0 or less means never).
pub fn interval(fleet: usize, budget: f64, min: Duration) -> Option<Duration> {
    if budget.is_nan() || budget <= 0.0 || budget.is_infinite() {
        return None;
    }
    let every = Duration::try_from_secs_f64(fleet.max(1) as f64 / budget).ok()?;
    Some(every.max(min))
}

/// When a pod is read next: one interval (stretched by up to a fifth, `jitter` in 0..1, so
/// proxies that started together drift apart and the fleet's mean rate stays under the
/// budget), doubled for each failure in a row up to 16 times.
pub fn next_due(now: Instant, every: Duration, failures: u32, jitter: f64) -> Instant {
    let backoff = 1u32 << failures.min(4);
    now + every.mul_f64(1.0 + 0.2 * jitter.clamp(0.0, 1.0)) * backoff
}

/// How long a scraped report counts: until the next read is surely due, within
/// `[staleness, max_age]`.
pub fn report_validity(every: Duration, staleness: Duration, max_age: Duration) -> Duration {
    every.mul_f64(1.25).min(max_age).max(staleness)
}

/// One pod to read.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    pub slot: Slot,
    pub addr: SocketAddr,
    pub kind: EngineKind,
    /// The model it was listed under (logs).
    pub model: Arc<str>,
    pub metrics: ScrapeMetrics,
}

/// The pods of `table` to read: those with a gauge slot, of models whose engine signals are
/// on, each pod once (under the first model, by name, that lists it).
pub fn targets_of(table: &RoutingTable, families: &EngineFamilies) -> Vec<ScrapeTarget> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for m in table.models() {
        if !m.spec.engine.reads_signals() {
            continue;
        }
        for p in &m.pods {
            let Some(slot) = p.slot else { continue };
            if seen.insert(p.addr) {
                out.push(ScrapeTarget {
                    slot,
                    addr: p.addr,
                    kind: m.spec.engine,
                    model: Arc::clone(&m.name),
                    metrics: ScrapeMetrics::resolve(families, &m.name, &p.label),
                });
            }
        }
    }
    out
}

/// Why a page was not read.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Send(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("the page is larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the page: {0}")]
    Body(String),
    #[error(transparent)]
    Page(#[from] PageError),
}

impl ScrapeError {
    pub fn result(&self) -> ScrapeResult {
        match self {
            ScrapeError::Connect(_) | ScrapeError::Send(_) | ScrapeError::Body(_) => {
                ScrapeResult::Connect
            }
            ScrapeError::Timeout(_) => ScrapeResult::Timeout,
            ScrapeError::Status(_) => ScrapeResult::Status,
            ScrapeError::TooLarge(_) | ScrapeError::Page(PageError::TooLarge) => {
                ScrapeResult::TooLarge
            }
            ScrapeError::Page(_) => ScrapeResult::Invalid,
        }
    }
}

/// The request head of a page read.
fn page_request(addr: SocketAddr, path: &http::uri::PathAndQuery, accept: &'static str) -> Parts {
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = Method::GET;
    parts.uri = http::Uri::from(path.clone());
    let host = HeaderValue::from_str(&addr.to_string()).expect("a socket address is a header");
    parts.headers.insert(header::HOST, host);
    parts
        .headers
        .insert(header::ACCEPT, HeaderValue::from_static(accept));
    parts
}

/// Which page to read.
#[derive(Debug, Clone, Copy)]
enum Page<'a> {
    Metrics(&'a http::uri::PathAndQuery),
    Slots,
}

impl Page<'_> {
    fn head(&self, addr: SocketAddr) -> Parts {
        match self {
            Page::Metrics(path) => page_request(addr, path, "text/plain;version=0.0.4"),
            Page::Slots => page_request(
                addr,
                &http::uri::PathAndQuery::from_static(SLOTS_PATH),
                "application/json",
            ),
        }
    }
}

/// Read the metrics page at `addr`, within the time and size caps.
pub async fn fetch(
    upstream: &Upstream,
    addr: SocketAddr,
    cfg: &ScrapeConfig,
) -> Result<Vec<u8>, ScrapeError> {
    fetch_page(upstream, addr, cfg, Page::Metrics(&cfg.path)).await
}

async fn fetch_page(
    upstream: &Upstream,
    addr: SocketAddr,
    cfg: &ScrapeConfig,
    page: Page<'_>,
) -> Result<Vec<u8>, ScrapeError> {
    tokio::time::timeout(cfg.timeout, fetch_uncapped(upstream, addr, cfg, page))
        .await
        .map_err(|_| ScrapeError::Timeout(cfg.timeout))?
}

async fn fetch_uncapped(
    upstream: &Upstream,
    addr: SocketAddr,
    cfg: &ScrapeConfig,
    page: Page<'_>,
) -> Result<Vec<u8>, ScrapeError> {
    let key = PoolKey::Addr(addr);
    let head = page.head(addr);
    let send_err = |e: SendError| ScrapeError::Send(error_chain(&e));
    let empty = || UpBody::bytes(Bytes::new());
    let sent = match upstream
        .acquire(&key)
        .await?
        .send(&head, &[], empty())
        .await
    {
        Ok(sent) => sent,
        // A pooled connection the pod closed meanwhile: once more on a new one.
        Err(SendError::Broken { reused: true, .. }) => upstream
            .connect(&key)
            .await?
            .send(&head, &[], empty())
            .await
            .map_err(send_err)?,
        Err(e) => return Err(send_err(e)),
    };
    let response = sent.response;
    if response.status() != StatusCode::OK {
        return Err(ScrapeError::Status(response.status()));
    }
    let cap = match page {
        Page::Metrics(_) => cfg.max_page,
        Page::Slots => cfg.max_slots_page,
    };
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(ScrapeError::TooLarge(cap));
    }
    let mut body = response.into_body();
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ScrapeError::Body(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > cap {
                return Err(ScrapeError::TooLarge(cap));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// Read and parse one pod's page.
pub async fn scrape(
    upstream: &Upstream,
    addr: SocketAddr,
    kind: EngineKind,
    cfg: &ScrapeConfig,
) -> Result<PageReport, ScrapeError> {
    let page = fetch(upstream, addr, cfg).await?;
    Ok(parse_page(&page, kind)?)
}

/// The scraper's list of pods, replaced whole when the routing table changes.
#[derive(Debug, Clone, Default)]
pub struct ScrapeTargets(Arc<ArcSwap<Vec<ScrapeTarget>>>);

impl ScrapeTargets {
    pub fn set(&self, targets: Vec<ScrapeTarget>) {
        self.0.store(Arc::new(targets));
    }

    fn load(&self) -> Arc<Vec<ScrapeTarget>> {
        self.0.load_full()
    }
}

/// Where one pod's reads stand.
#[derive(Debug)]
struct PodState {
    next_due: Instant,
    failures: u32,
    busy: bool,
    /// Its failure was logged at info; the recovery will be too.
    logged: bool,
    /// When its `/slots` page is read next.
    prompts_due: Instant,
    prompts_busy: bool,
    /// Its `/slots` page is not read before then (it showed no prompts).
    prompts_off_until: Option<Instant>,
}

/// What a read made of the pod's `/slots` page.
#[derive(Debug)]
enum PromptsRead {
    Read,
    /// The page shows no prompts, or there is none.
    Hidden(String),
    Failed(String),
}

/// One read's outcome.
enum ReadOutcome {
    Metrics(SocketAddr, Result<(), String>),
    Prompts(SocketAddr, PromptsRead),
}

/// The background task (see the module docs).
pub struct Scraper {
    cfg: ScrapeConfig,
    store: Arc<SignalStore>,
    fleet: Arc<AtomicUsize>,
    upstream: Upstream,
    targets: ScrapeTargets,
}

impl Scraper {
    /// A scraper reporting to `store`; `fleet` is the number of proxies that discovery sees
    /// (0 counts as 1); `hook` registers its connections with the node-wide gauge, as the
    /// request path's are, but its reads never count as requests in flight.
    pub fn new(
        cfg: ScrapeConfig,
        store: Arc<SignalStore>,
        fleet: Arc<AtomicUsize>,
        hook: Option<Arc<dyn ConnectionHook>>,
    ) -> Self {
        let opts = UpstreamOptions {
            connect_timeout: cfg.connect_timeout,
            keepalive: true,
            max_idle_per_target: 1,
            requests_count_as_load: false,
            ..UpstreamOptions::default()
        };
        Self {
            cfg,
            store,
            fleet,
            upstream: Upstream::new(opts, hook),
            targets: ScrapeTargets::default(),
        }
    }

    /// The handle to give it pods (see [`targets_of`]).
    pub fn targets(&self) -> ScrapeTargets {
        self.targets.clone()
    }

    /// Read pages until the task is dropped or aborted.
    pub async fn run(self) {
        let me = Arc::new(self);
        let mut pods: HashMap<SocketAddr, PodState> = HashMap::new();
        let mut reads: JoinSet<ReadOutcome> = JoinSet::new();
        let mut tick = tokio::time::interval(me.cfg.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => me.start_due(&mut pods, &mut reads),
                Some(done) = reads.join_next(), if !reads.is_empty() => {
                    match done {
                        Ok(ReadOutcome::Metrics(addr, outcome)) => finish(&mut pods, addr, outcome),
                        Ok(ReadOutcome::Prompts(addr, read)) => finish_prompts(&mut pods, addr, read),
                        Err(_) => {}
                    }
                }
            }
        }
    }

    fn start_due(
        self: &Arc<Self>,
        pods: &mut HashMap<SocketAddr, PodState>,
        reads: &mut JoinSet<ReadOutcome>,
    ) {
        let now = Instant::now();
        let targets = self.targets.load();
        let listed: std::collections::HashSet<SocketAddr> =
            targets.iter().map(|t| t.addr).collect();
        pods.retain(|addr, _| listed.contains(addr));
        let fleet = self.fleet.load(Ordering::Relaxed);
        let every = interval(fleet, self.cfg.budget, self.cfg.min_interval);
        let prompts_every = interval(fleet, self.cfg.slot_prompts_budget, self.cfg.min_interval);
        for t in targets.iter() {
            // A new pod's first read falls anywhere in the first interval, so a fleet that
            // learns of it at once does not read it at once.
            let first = |every: Option<Duration>| {
                now + every.unwrap_or_default().mul_f64(rand::random::<f64>())
            };
            let st = pods.entry(t.addr).or_insert_with(|| PodState {
                next_due: first(every),
                failures: 0,
                busy: false,
                logged: false,
                prompts_due: first(prompts_every),
                prompts_busy: false,
                prompts_off_until: None,
            });
            if let Some(prompts_every) = prompts_every {
                self.start_prompts(t, st, now, prompts_every, reads);
            }
            let Some(every) = every else { continue };
            if st.busy || now < st.next_due || reads.len() >= self.cfg.concurrency {
                continue;
            }
            st.next_due = next_due(now, every, st.failures, rand::random::<f64>());
            if !self.store.wants_scrape(t.slot, now, every) {
                continue;
            }
            st.busy = true;
            let valid = report_validity(every, self.store.staleness(), self.cfg.max_report_age);
            reads.spawn(Arc::clone(self).read(t.clone(), valid));
        }
    }

    /// Start a read of the pod's `/slots` page if it is due: a llama.cpp pod (its model says
    /// so, or its metrics page was read as one) that has not hidden its prompts lately.
    fn start_prompts(
        self: &Arc<Self>,
        t: &ScrapeTarget,
        st: &mut PodState,
        now: Instant,
        every: Duration,
        reads: &mut JoinSet<ReadOutcome>,
    ) {
        let llama = match t.kind {
            EngineKind::LlamaCpp => true,
            EngineKind::Auto => self.store.caches_per_slot(t.slot),
            EngineKind::Vllm | EngineKind::Sglang | EngineKind::None => false,
        };
        let hidden = st.prompts_off_until.is_some_and(|until| now < until);
        if !llama
            || hidden
            || st.prompts_busy
            || now < st.prompts_due
            || reads.len() >= self.cfg.concurrency
        {
            return;
        }
        st.prompts_due = next_due(now, every, 0, rand::random::<f64>());
        st.prompts_busy = true;
        let valid = report_validity(every, self.store.staleness(), self.cfg.max_report_age);
        let me = Arc::clone(self);
        let t = t.clone();
        reads.spawn(async move {
            let read = me.read_prompts(&t, now, valid).await;
            t.metrics.record_slots(match read {
                PromptsRead::Read => SlotReadResult::Ok,
                PromptsRead::Hidden(_) => SlotReadResult::Hidden,
                PromptsRead::Failed(_) => SlotReadResult::Failed,
            });
            ReadOutcome::Prompts(t.addr, read)
        });
    }

    async fn read(self: Arc<Self>, t: ScrapeTarget, valid: Duration) -> ReadOutcome {
        let stamp = self.store.stamp(t.slot, Source::Scrape, Instant::now());
        let outcome = match scrape(&self.upstream, t.addr, t.kind, &self.cfg).await {
            Ok(page) => {
                self.store.note_engine(t.slot, page.kind);
                self.store.record(t.slot, &page.report, stamp, valid);
                t.metrics.record(ScrapeResult::Ok);
                Ok(())
            }
            Err(e) => {
                t.metrics.record(e.result());
                Err(format!("model {}: {e}", t.model))
            }
        };
        ReadOutcome::Metrics(t.addr, outcome)
    }

    /// Read the pod's `/slots` page into its prompt view; a page that cannot be read leaves
    /// the pod with none.
    async fn read_prompts(&self, t: &ScrapeTarget, asked: Instant, valid: Duration) -> PromptsRead {
        let views = self.store.prompts();
        let page = match fetch_page(&self.upstream, t.addr, &self.cfg, Page::Slots).await {
            Ok(page) => page,
            Err(ScrapeError::Status(s))
                if s == StatusCode::NOT_FOUND || s == StatusCode::NOT_IMPLEMENTED =>
            {
                views.set(t.slot, None);
                return PromptsRead::Hidden(format!("{SLOTS_PATH} answered {s}"));
            }
            Err(e) => {
                views.set(t.slot, None);
                return PromptsRead::Failed(format!("model {}: {SLOTS_PATH}: {e}", t.model));
            }
        };
        match parse_slots(&page) {
            Ok(Parsed::Prompts(slots, empty)) => {
                let previous = views.any(t.slot);
                let view = PodPrompts::after(previous.as_deref(), slots, asked, valid)
                    .with_empty_slots(empty);
                views.set(t.slot, Some(view));
                PromptsRead::Read
            }
            Ok(Parsed::NoPrompts) => {
                views.set(t.slot, None);
                PromptsRead::Hidden(format!("{SLOTS_PATH} shows no prompts"))
            }
            Err(e) => {
                views.set(t.slot, None);
                PromptsRead::Failed(format!("model {}: {SLOTS_PATH}: {e}", t.model))
            }
        }
    }
}

/// A `/slots` read ended: a page that shows no prompts is not asked for again before
/// [`PROMPTS_RETRY`] (said once at info, with what to do), a failed one at the next read.
fn finish_prompts(pods: &mut HashMap<SocketAddr, PodState>, addr: SocketAddr, read: PromptsRead) {
    let Some(st) = pods.get_mut(&addr) else {
        return;
    };
    st.prompts_busy = false;
    match read {
        PromptsRead::Read => {}
        PromptsRead::Hidden(why) => {
            if st.prompts_off_until.is_none() {
                tracing::info!(pod = %addr, %why, retry_s = PROMPTS_RETRY.as_secs(), "llama.cpp pod does not show its slots' prompts: the proxies of a fleet place its prompts by hash (start the server with LLAMA_SERVER_SLOTS_DEBUG=1 to let them share its view)");
            }
            st.prompts_off_until = Some(Instant::now() + PROMPTS_RETRY);
        }
        PromptsRead::Failed(e) => {
            tracing::debug!(pod = %addr, error = %e, "slot prompts read failed");
        }
    }
}

/// A read ended: log the first failure of a run at info, the rest at debug, and the recovery.
fn finish(pods: &mut HashMap<SocketAddr, PodState>, addr: SocketAddr, outcome: Result<(), String>) {
    let Some(st) = pods.get_mut(&addr) else {
        return;
    };
    st.busy = false;
    match outcome {
        Ok(()) => {
            if std::mem::take(&mut st.logged) {
                tracing::info!(pod = %addr, "engine metrics readable again");
            }
            st.failures = 0;
        }
        Err(e) => {
            st.failures = st.failures.saturating_add(1);
            if st.logged {
                tracing::debug!(pod = %addr, error = %e, failures = st.failures, "engine metrics read failed");
            } else {
                tracing::info!(pod = %addr, error = %e, "cannot read the pod's engine metrics; it is routed by node-local load until they are back");
                st.logged = true;
            }
        }
    }
}

#[cfg(test)]
mod tests;
