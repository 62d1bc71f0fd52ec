//! The two tenants' clients: tenant A keeps a fixed number of requests in flight (one thread
//! each, a new request as soon as its last one is answered), tenant B sends one request every
//! interval (a thread per request, so B's rate never waits on its own answers). Every request
//! is one blocking HTTP/1.1 exchange on its own connection, recorded with its send time,
//! latency and status (`None`: the exchange failed, which the bench counts as unanswered).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flexinfer_test_support::harness::http::{Conn, Request, Timeouts};

/// Which client sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tenant {
    /// The one that keeps its requests in flight.
    A,
    /// The one that sends at a steady rate.
    B,
}

impl Tenant {
    pub(super) fn name(self) -> &'static str {
        match self {
            Tenant::A => "A",
            Tenant::B => "B",
        }
    }
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record {
    pub tenant: Tenant,
    /// Since the run started.
    pub sent: Duration,
    pub latency: Duration,
    pub status: Option<u16>,
}

/// What every client thread shares.
#[derive(Clone)]
pub(super) struct Clients {
    pub proxy: SocketAddr,
    pub start: Instant,
    /// The tenant header of each tenant (`None`: no header, the shared tenant).
    pub tenant_a: Option<&'static str>,
    pub tenant_b: Option<&'static str>,
    /// B's `x-flexinfer-priority`, if it sends one.
    pub priority_b: Option<&'static str>,
    pub records: Arc<Mutex<Vec<Record>>>,
    pub stop: Arc<AtomicBool>,
}

/// The chat body every request sends.
const BODY: &[u8] =
    br#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;

/// Longer than any answer can take (the queue timeout is 30 s): a read that times out is an
/// unanswered request, not a slow one.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

impl Clients {
    fn tenant_header(&self, t: Tenant) -> Option<&'static str> {
        match t {
            Tenant::A => self.tenant_a,
            Tenant::B => self.tenant_b,
        }
    }

    /// Send one request as `tenant` and record it.
    fn one(&self, tenant: Tenant) {
        let sent = self.start.elapsed();
        let t0 = Instant::now();
        let mut req = Request::post("/v1/chat/completions", BODY);
        if let Some(id) = self.tenant_header(tenant) {
            req = req.header("x-flexinfer-tenant", id);
        }
        if let (Tenant::B, Some(p)) = (tenant, self.priority_b) {
            req = req.header("x-flexinfer-priority", p);
        }
        let timeouts = Timeouts {
            read: READ_TIMEOUT,
            ..Timeouts::default()
        };
        let status = Conn::connect(self.proxy, timeouts)
            .and_then(|mut c| c.exchange(&req))
            .ok()
            .filter(|r| r.complete)
            .map(|r| r.status);
        let record = Record {
            tenant,
            sent,
            latency: t0.elapsed(),
            status,
        };
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    /// Tenant A: `n` threads, each sending until [`Clients::stop`] is set.
    pub(super) fn keep_in_flight(&self, n: usize) -> Vec<JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let c = self.clone();
                std::thread::spawn(move || {
                    while !c.stop.load(Ordering::SeqCst) {
                        c.one(Tenant::A);
                    }
                })
            })
            .collect()
    }

    /// Tenant B: one request every `every` for `total`, each on its own thread; returns when
    /// the last one is answered.
    pub(super) fn steady(&self, every: Duration, total: Duration) {
        let begin = Instant::now();
        let mut threads = Vec::new();
        let mut next = begin;
        while next < begin + total {
            let c = self.clone();
            threads.push(std::thread::spawn(move || c.one(Tenant::B)));
            next += every;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        for t in threads {
            let _ = t.join();
        }
    }

    pub(super) fn take_records(&self) -> Vec<Record> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
