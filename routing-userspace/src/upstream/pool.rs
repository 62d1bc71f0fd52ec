//! Idle upstream connections, per target, most recently used first (a warm connection, and
//! the ones left unused age out). A connection is only ever in the pool while idle.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

use super::UpBody;

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

struct Idle {
    sender: SendRequest<UpBody>,
    since: Instant,
}

pub struct Pool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>>>,
    max_per_target: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub fn new(max_per_target: usize, idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            max_per_target,
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Vec<Idle>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection to `key` that is still open and young enough.
    pub fn take(&self, key: &PoolKey) -> Option<SendRequest<UpBody>> {
        let now = Instant::now();
        let mut idle = self.lock();
        let list = idle.get_mut(key)?;
        while let Some(c) = list.pop() {
            if !c.sender.is_closed() && now.saturating_duration_since(c.since) < self.idle_timeout {
                return Some(c.sender);
            }
        }
        None
    }

    /// Keep an idle connection (unless it is closed or the target has enough).
    pub fn put(&self, key: PoolKey, sender: SendRequest<UpBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        let list = idle.entry(key).or_default();
        if list.len() < self.max_per_target {
            list.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// Close idle connections that are closed or too old (run every few seconds).
    pub fn purge(&self) {
        let now = Instant::now();
        let mut idle = self.lock();
        idle.retain(|_, list| {
            list.retain(|c| {
                !c.sender.is_closed() && now.saturating_duration_since(c.since) < self.idle_timeout
            });
            !list.is_empty()
        });
    }

    /// Idle connections held.
    pub fn idle(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}
