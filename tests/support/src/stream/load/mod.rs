//! The load generator of `bench stream`: `connections` client connections spread over a few
//! epoll threads, each streaming one answer after another (keep-alive), every event read and
//! timestamped on arrival.
//!
//! Per event it records the delay against the send time the upstream stamped in it (one
//! CLOCK_MONOTONIC for all processes, so receive - send is the whole relay delay) and the gap
//! since the stream's previous event. Phases: connect at a bounded rate until every connection
//! has streamed an event (all streams open), warm up, then a measured window; only events that
//! arrive inside the window count. Around the window it reads the CPU time and RSS of the
//! processes it is told to watch (the proxy), so the figures and the window are the same span.
//! In idle mode it only opens the connections and sends nothing, for the memory an idle
//! client connection costs; idle after an answer, each connection reads one whole answer and
//! then sends nothing more (a client's keep-alive connection between two requests).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::epoll::{Epoll, READ};
use super::wire::{Decoder, Item};
use crate::harness::os::{mono_ns, tree_cpu, tree_rss_kib};
use crate::harness::stats::Histogram;

/// What a connection of the load does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMode {
    /// Stream one answer after another.
    Stream,
    /// Connect and send nothing.
    Idle,
    /// Send one request, read its whole answer, then send nothing more: the connection counts
    /// as open once that answer has ended.
    IdleAfterAnswer,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Connection `i` goes to `targets[i % len]`.
    pub targets: Vec<SocketAddr>,
    pub connections: usize,
    pub threads: usize,
    /// The request each stream sends, whole (head and body, keep-alive).
    pub request: Vec<u8>,
    /// What each connection does once connected.
    pub client: ClientMode,
    /// New connections per second, at most.
    pub connect_rate: u32,
    /// Every connection must be open (streaming, or connected when idle) within this.
    pub open_timeout: Duration,
    /// After all are open, before the window.
    pub warmup: Duration,
    pub duration: Duration,
    /// Processes (name, pid) whose CPU time and RSS are reported.
    pub watch: Vec<(String, u32)>,
}

/// Counts of one worker (and, merged, of the run).
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// Stamped events that arrived inside the window.
    pub events: u64,
    /// Answers that ended inside the window.
    pub answers: u64,
    pub connect_errors: u64,
    /// Answers with a status other than 200.
    pub bad_status: u64,
    pub decode_errors: u64,
    /// Connections the server closed or reset (streams: reopened).
    pub closed: u64,
    /// Receive time minus the stamped send time, microseconds.
    pub delay_us: Histogram,
    /// Between two events of one answer, microseconds.
    pub gap_us: Histogram,
}

impl Counts {
    fn merge(&mut self, o: &Counts) {
        self.events += o.events;
        self.answers += o.answers;
        self.connect_errors += o.connect_errors;
        self.bad_status += o.bad_status;
        self.decode_errors += o.decode_errors;
        self.closed += o.closed;
        self.delay_us.merge(&o.delay_us);
        self.gap_us.merge(&o.gap_us);
    }
}

/// A watched process around the window.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    pub name: String,
    pub cpu: Duration,
    pub rss_idle_kib: u64,
    pub rss_open_kib: u64,
    pub rss_end_kib: u64,
}

#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub connections: usize,
    /// Connections that streamed (or, idle, connected) before the window.
    pub opened: usize,
    /// From the start to all connections open.
    pub open_time: Duration,
    pub window: Duration,
    pub counts: Counts,
    /// This process's CPU time over the window.
    pub self_cpu: Duration,
    pub watched: Vec<Watched>,
    /// Idle mode: connections still open at the end of the window.
    pub still_open: usize,
}

/// What the threads share: the phase and the window's bounds.
struct Shared {
    /// Connections that are open (streamed an event, or connected when idle).
    opened: AtomicUsize,
    /// Idle mode: connections the server closed.
    gone: AtomicUsize,
    window_start: AtomicU64,
    window_end: AtomicU64,
    stop: AtomicU64,
}

impl Shared {
    fn in_window(&self, ns: u64) -> bool {
        let start = self.window_start.load(Ordering::Relaxed);
        start != 0 && ns >= start && ns < self.window_end.load(Ordering::Relaxed)
    }
}

/// Run the load and report.
pub fn run(cfg: &LoadConfig) -> io::Result<LoadReport> {
    if cfg.targets.is_empty() || cfg.connections == 0 || cfg.threads == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "need targets, connections and threads",
        ));
    }
    let shared = Arc::new(Shared {
        opened: AtomicUsize::new(0),
        gone: AtomicUsize::new(0),
        window_start: AtomicU64::new(0),
        window_end: AtomicU64::new(u64::MAX),
        stop: AtomicU64::new(0),
    });
    let mut watched: Vec<Watched> = cfg
        .watch
        .iter()
        .map(|(name, pid)| Watched {
            name: name.clone(),
            rss_idle_kib: tree_rss_kib(*pid),
            ..Watched::default()
        })
        .collect();
    let start = Instant::now();
    let workers: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (cfg, shared) = (cfg.clone(), Arc::clone(&shared));
            std::thread::spawn(move || Worker::new(t, &cfg, shared).and_then(Worker::run))
        })
        .collect();
    let opened = wait_open(cfg, &shared, start);
    let open_time = start.elapsed();
    let mut report = LoadReport {
        connections: cfg.connections,
        opened,
        open_time,
        ..LoadReport::default()
    };
    if opened == cfg.connections {
        measure(cfg, &shared, &mut watched, &mut report);
    }
    shared.stop.store(1, Ordering::Relaxed);
    for w in workers {
        let counts = w
            .join()
            .map_err(|_| io::Error::other("a load thread panicked"))??;
        report.counts.merge(&counts);
    }
    report.watched = watched;
    if opened < cfg.connections {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "only {opened} of {} connections open after {:?} ({} connect errors, {} bad status, {} closed)",
                cfg.connections, cfg.open_timeout, report.counts.connect_errors, report.counts.bad_status, report.counts.closed
            ),
        ));
    }
    Ok(report)
}

/// Wait until every connection is open or the open timeout passes; how many opened.
fn wait_open(cfg: &LoadConfig, shared: &Shared, start: Instant) -> usize {
    loop {
        let opened = shared.opened.load(Ordering::Relaxed);
        if opened >= cfg.connections || start.elapsed() >= cfg.open_timeout {
            return opened;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Warm up, then the window, with the watched processes read at its edges.
fn measure(cfg: &LoadConfig, shared: &Shared, watched: &mut [Watched], report: &mut LoadReport) {
    std::thread::sleep(cfg.warmup);
    let me = std::process::id();
    let cpu0: Vec<Duration> = cfg.watch.iter().map(|(_, p)| tree_cpu(*p)).collect();
    for (w, (_, pid)) in watched.iter_mut().zip(&cfg.watch) {
        w.rss_open_kib = tree_rss_kib(*pid);
    }
    let self0 = tree_cpu(me);
    let t0 = mono_ns();
    shared.window_start.store(t0, Ordering::Relaxed);
    std::thread::sleep(cfg.duration);
    let t1 = mono_ns();
    shared.window_end.store(t1, Ordering::Relaxed);
    report.self_cpu = tree_cpu(me).saturating_sub(self0);
    for ((w, (_, pid)), c0) in watched.iter_mut().zip(&cfg.watch).zip(cpu0) {
        w.cpu = tree_cpu(*pid).saturating_sub(c0);
        w.rss_end_kib = tree_rss_kib(*pid);
    }
    report.window = Duration::from_nanos(t1 - t0);
    report.still_open = cfg.connections - shared.gone.load(Ordering::Relaxed);
}

/// One client connection.
struct Client {
    sock: TcpStream,
    target: SocketAddr,
    dec: Decoder,
    /// Whether it has counted as open.
    open: bool,
    /// Receive time of the answer's previous event (0: none yet).
    last_ns: u64,
    /// The current answer's status was not 200.
    failed: bool,
}

struct Worker {
    cfg: LoadConfig,
    shared: Arc<Shared>,
    ep: Epoll,
    clients: Vec<Option<Client>>,
    /// Indexes (into `cfg.targets` order) of the connections this worker owns.
    todo: Vec<usize>,
    started: Instant,
    counts: Counts,
}

impl Worker {
    fn new(t: usize, cfg: &LoadConfig, shared: Arc<Shared>) -> io::Result<Self> {
        let todo: Vec<usize> = (t..cfg.connections).step_by(cfg.threads).rev().collect();
        Ok(Self {
            cfg: cfg.clone(),
            shared,
            ep: Epoll::new(1024)?,
            clients: Vec::new(),
            todo,
            started: Instant::now(),
            counts: Counts::default(),
        })
    }

    fn run(mut self) -> io::Result<Counts> {
        let mut buf = vec![0u8; 64 * 1024];
        while self.shared.stop.load(Ordering::Relaxed) == 0 {
            self.connect_some();
            let timeout = if self.todo.is_empty() { 50 } else { 1 };
            for r in self.ep.wait(timeout)? {
                self.read(r.token as usize, &mut buf);
            }
        }
        Ok(self.counts)
    }

    /// Open the connections that are due by the connect rate (a failed connect is counted
    /// and not retried: the run then reports how many opened).
    fn connect_some(&mut self) {
        let per_thread = (f64::from(self.cfg.connect_rate) / self.cfg.threads as f64).max(1.0);
        let due = (self.started.elapsed().as_secs_f64() * per_thread) as usize + 1;
        while self.clients.len() < due {
            let Some(i) = self.todo.pop() else { return };
            let target = self.cfg.targets[i % self.cfg.targets.len()];
            let token = self.clients.len();
            let client = self.open(target, token);
            self.clients.push(client);
        }
    }

    /// A new connection to `target` with its request sent (unless idle), registered as `token`.
    fn open(&mut self, target: SocketAddr, token: usize) -> Option<Client> {
        let attempt = || -> io::Result<TcpStream> {
            let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
            let _ = s.set_nodelay(true);
            if self.cfg.client != ClientMode::Idle {
                s.write_all(&self.cfg.request)?;
            }
            s.set_nonblocking(true)?;
            self.ep.add(&s, token as u64, READ)?;
            Ok(s)
        };
        match attempt() {
            Ok(sock) => {
                let idle = self.cfg.client == ClientMode::Idle;
                if idle {
                    self.shared.opened.fetch_add(1, Ordering::Relaxed);
                }
                Some(Client {
                    sock,
                    target,
                    dec: Decoder::new(),
                    open: idle,
                    last_ns: 0,
                    failed: false,
                })
            }
            Err(_) => {
                self.counts.connect_errors += 1;
                None
            }
        }
    }

    /// Read what arrived on client `token`; reopen it if the server closed it.
    fn read(&mut self, token: usize, buf: &mut [u8]) {
        let Some(mut c) = self.clients.get_mut(token).and_then(Option::take) else {
            return;
        };
        let alive = loop {
            match c.sock.read(buf) {
                Ok(0) => break false,
                Ok(n) => {
                    let now = mono_ns();
                    if !self.consume(&mut c, &buf[..n], now) {
                        break false;
                    }
                    // A short read drained the socket (epoll reports it again if more came):
                    // save the read that would only say EAGAIN.
                    if n < buf.len() {
                        break true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        if alive {
            self.clients[token] = Some(c);
            return;
        }
        let _ = self.ep.delete(&c.sock);
        if self.shared.stop.load(Ordering::Relaxed) != 0 {
            return;
        }
        self.counts.closed += 1;
        let idle = match self.cfg.client {
            ClientMode::Stream => false,
            ClientMode::Idle => true,
            ClientMode::IdleAfterAnswer => c.open,
        };
        if idle {
            self.shared.gone.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // A stream that was cut: open another in its place (it already counted as open).
        let was_open = c.open;
        let mut fresh = self.open(c.target, token);
        if let Some(f) = fresh.as_mut() {
            f.open = was_open;
        }
        self.clients[token] = fresh;
    }

    /// Decode bytes that arrived at `now`; `false` if the connection must be dropped.
    fn consume(&mut self, c: &mut Client, bytes: &[u8], now: u64) -> bool {
        let shared = &self.shared;
        let counts = &mut self.counts;
        let after_answer = self.cfg.client == ClientMode::IdleAfterAnswer;
        let mut ended = 0;
        let fed = c.dec.feed(bytes, &mut |item| match item {
            Item::Head(status) => {
                c.failed = status != 200;
                if c.failed {
                    counts.bad_status += 1;
                }
            }
            Item::Event {
                sent_ns: Some(sent),
                ..
            } => {
                if !c.open && !after_answer {
                    c.open = true;
                    shared.opened.fetch_add(1, Ordering::Relaxed);
                }
                if shared.in_window(now) {
                    counts.events += 1;
                    counts.delay_us.record(now.saturating_sub(sent) / 1000);
                    if c.last_ns != 0 {
                        counts.gap_us.record((now - c.last_ns) / 1000);
                    }
                }
                c.last_ns = now;
            }
            Item::Event { .. } => {}
            Item::End => {
                if shared.in_window(now) && !c.failed {
                    counts.answers += 1;
                }
                if after_answer && !c.failed && !c.open {
                    c.open = true;
                    shared.opened.fetch_add(1, Ordering::Relaxed);
                }
                c.last_ns = 0;
                ended += 1;
            }
        });
        if fed.is_err() {
            self.counts.decode_errors += 1;
            return false;
        }
        if c.failed && ended > 0 {
            return false; // an error answer: start over on a new connection
        }
        if after_answer {
            return true; // one answer only, then idle
        }
        (0..ended).all(|_| c.sock.write_all(&self.cfg.request).is_ok())
    }
}

/// `RESULT key=value ...`: the report as one line (durations in microseconds, memory in KiB).
pub fn result_line(r: &LoadReport) -> String {
    let c = &r.counts;
    let q = |h: &Histogram, p: f64| {
        let v = h.quantile(p);
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            "nan".into()
        }
    };
    let mut s = format!(
        "RESULT connections={} opened={} open_us={} window_us={} events={} answers={} connect_errors={} bad_status={} decode_errors={} closed={} still_open={} self_cpu_us={}",
        r.connections, r.opened, r.open_time.as_micros(), r.window.as_micros(), c.events, c.answers,
        c.connect_errors, c.bad_status, c.decode_errors, c.closed, r.still_open, r.self_cpu.as_micros()
    );
    for (name, h) in [("delay", &c.delay_us), ("gap", &c.gap_us)] {
        for (label, p) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)] {
            s.push_str(&format!(" {name}_{label}_us={}", q(h, p)));
        }
        s.push_str(&format!(" {name}_max_us={}", h.max()));
    }
    for w in &r.watched {
        s.push_str(&format!(
            " {0}_cpu_us={1} {0}_rss_idle_kib={2} {0}_rss_open_kib={3} {0}_rss_end_kib={4}",
            w.name,
            w.cpu.as_micros(),
            w.rss_idle_kib,
            w.rss_open_kib,
            w.rss_end_kib
        ));
    }
    s
}

#[cfg(test)]
mod tests;
