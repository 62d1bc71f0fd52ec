//! Idle upstream connections, per target, most recently used first (a warm connection, and
//! the ones left unused age out). A connection is only ever in the pool while idle.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;

use super::h1::H1Conn;

/// Idle connections by target. Keys are pod addresses and configured Service names, never a
/// client's bytes, so they are hashed with foldhash (seeded per process), not SipHash: two
/// lookups per request.
type IdleMap = HashMap<PoolKey, Vec<Idle>, RandomState>;

/// Where a connection goes: a pod's address, or a Service's `host:port` (resolved at connect).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PoolKey {
    Addr(SocketAddr),
    Host(Arc<str>),
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolKey::Addr(a) => write!(f, "{a}"),
            PoolKey::Host(h) => f.write_str(h),
        }
    }
}

#[derive(Debug)]
struct Idle {
    conn: Box<H1Conn>,
    /// [`Pool::tick`] when it became idle.
    since: u64,
}

/// Idle ages are measured in ticks of a coarse clock that [`Pool::purge`] advances (every
/// second or so), so taking and returning a connection reads no clock.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<IdleMap>,
    max_per_target: usize,
    idle_timeout: Duration,
    start: Instant,
    /// Milliseconds since `start`, as of the last purge.
    tick: AtomicU64,
}

impl Pool {
    pub fn new(max_per_target: usize, idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(IdleMap::default()),
            max_per_target,
            idle_timeout,
            start: Instant::now(),
            tick: AtomicU64::new(0),
        }
    }

    fn young(&self, since: u64, now: u64) -> bool {
        Duration::from_millis(now.saturating_sub(since)) < self.idle_timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleMap> {
        crate::lock::lock(&self.idle)
    }

    /// The most recently used idle connection to `key` that is young enough and that its
    /// server has not closed. (A close racing this check shows on the connection's next
    /// request, which then goes out again on a fresh connection.)
    pub fn take(&self, key: &PoolKey) -> Option<Box<H1Conn>> {
        let now = self.tick.load(Ordering::Relaxed);
        let mut idle = self.lock();
        let list = idle.get_mut(key)?;
        while let Some(c) = list.pop() {
            if self.young(c.since, now) && !c.conn.peer_closed() {
                return Some(c.conn);
            }
        }
        None
    }

    /// Keep an idle connection (unless the target has enough).
    pub fn put(&self, key: PoolKey, conn: Box<H1Conn>) {
        let mut idle = self.lock();
        let list = idle.entry(key).or_default();
        if list.len() < self.max_per_target {
            list.push(Idle {
                conn,
                since: self.tick.load(Ordering::Relaxed),
            });
        }
    }

    /// Advance the clock and close idle connections that are too old or closed by their
    /// server (run every second or so).
    pub fn purge(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.tick.store(now, Ordering::Relaxed);
        let mut idle = self.lock();
        idle.retain(|_, list| {
            list.retain(|c| self.young(c.since, now) && !c.conn.peer_closed());
            !list.is_empty()
        });
    }

    /// Idle connections held.
    pub fn idle(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}
