//! The upstream side: HTTP/1.1 connections to pods and Services, pooled per target.
//!
//! The proxy owns its connections instead of going through a general-purpose client, for three
//! reasons. Connecting is a step of its own, before any byte of the request exists on the
//! wire, so a failed connect can move to the next candidate with the request untouched (no
//! copy kept for a retry). The request's own task drives its connection ([`h1`]): no connection
//! task, no channels between them. And the proxy knows which connection carries which request,
//! which is what a per-connection load gauge needs (each new connection is reported to a
//! [`ConnectionHook`] once, with its socket). A connection goes back to its pool only after
//! its response body was read to the end; one whose body was abandoned is closed.

pub mod body;
pub mod h1;
pub mod pool;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tokio::net::TcpStream;

pub use crate::load::ebpf::ConnTrack;
pub use body::UpBody;
pub use h1::{H1Conn, SendError, Sent, UpstreamBody};
pub use pool::{Pool, PoolKey};

/// Why a connection could not be made (nothing was sent).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connecting to {target} timed out after {timeout:?}")]
    Timeout { target: String, timeout: Duration },
    #[error("connecting to {target}: {source}")]
    Io {
        target: String,
        source: std::io::Error,
    },
    #[error("resolving {target}: no address")]
    NoAddress { target: String },
}

/// Runs once for every new upstream connection, with its socket, before the first request.
/// What it returns marks each request on the connection busy and idle (the eBPF gauge).
pub trait ConnectionHook: Send + Sync + 'static {
    fn connected(&self, stream: &TcpStream, peer: SocketAddr) -> Option<ConnTrack>;
}

/// Upstream settings.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    /// Keep connections for reuse (otherwise one connection per request).
    pub keepalive: bool,
    /// Idle pooled connections older than this are closed rather than reused (shorter than
    /// the keep-alive timeout of common model servers, 5 s for uvicorn, so the proxy rarely
    /// reuses a connection the server is closing).
    pub idle_timeout: Duration,
    /// Idle connections kept per target (well below the 512 connections per pod the eBPF
    /// gauge tells apart).
    pub max_idle_per_target: usize,
    /// Whether a request on these connections counts in flight on its pod, node-wide (the
    /// eBPF gauge). The engine scraper's do not: a read of a metrics page is no request the
    /// pod runs, and every proxy of the fleet makes them. Its connections are registered all
    /// the same, since an unregistered connection would count for as long as it is open.
    pub requests_count_as_load: bool,
}

impl UpstreamOptions {
    pub const DEFAULT: Self = Self {
        connect_timeout: Duration::from_secs(2),
        keepalive: true,
        idle_timeout: Duration::from_secs(4),
        max_idle_per_target: 256,
        requests_count_as_load: true,
    };
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[derive(Clone)]
pub struct Upstream {
    pool: Arc<Pool>,
    opts: UpstreamOptions,
    hook: Option<Arc<dyn ConnectionHook>>,
}

/// A connection ready for one request, and where it goes back to afterwards.
#[derive(Debug)]
pub struct Conn {
    inner: Box<H1Conn>,
    key: PoolKey,
    pool: Option<Arc<Pool>>,
}

impl Upstream {
    pub fn new(opts: UpstreamOptions, hook: Option<Arc<dyn ConnectionHook>>) -> Self {
        Self {
            pool: Arc::new(Pool::new(opts.max_idle_per_target, opts.idle_timeout)),
            opts,
            hook,
        }
    }

    pub fn keepalive(&self) -> bool {
        self.opts.keepalive
    }

    /// Idle connections currently pooled.
    pub fn idle_connections(&self) -> usize {
        self.pool.idle()
    }

    /// Close idle connections that aged out.
    pub fn purge_idle(&self) {
        self.pool.purge();
    }

    /// A connection to `key`: a pooled idle one, else a new one.
    pub async fn acquire(&self, key: &PoolKey) -> Result<Conn, ConnectError> {
        if self.opts.keepalive {
            if let Some(inner) = self.pool.take(key) {
                return Ok(self.conn(inner, key));
            }
        }
        self.connect(key).await
    }

    fn conn(&self, inner: Box<H1Conn>, key: &PoolKey) -> Conn {
        Conn {
            inner,
            key: key.clone(),
            pool: self.opts.keepalive.then(|| Arc::clone(&self.pool)),
        }
    }

    /// A new connection to `key` (never from the pool).
    pub async fn connect(&self, key: &PoolKey) -> Result<Conn, ConnectError> {
        let timeout = self.opts.connect_timeout;
        let stream = tokio::time::timeout(timeout, dial(key))
            .await
            .map_err(|_| ConnectError::Timeout {
                target: key.to_string(),
                timeout,
            })??;
        let _ = stream.set_nodelay(true);
        let track = match (&self.hook, stream.peer_addr()) {
            (Some(hook), Ok(peer)) => hook.connected(&stream, peer),
            _ => None,
        };
        if !self.opts.requests_count_as_load {
            // The kernel counts a new connection busy until its owner says otherwise.
            if let Some(t) = &track {
                t.idle();
            }
        }
        let mut inner = H1Conn::new(stream);
        inner.track = track;
        inner.counts_as_load = self.opts.requests_count_as_load;
        Ok(self.conn(inner, key))
    }
}

async fn dial(key: &PoolKey) -> Result<TcpStream, ConnectError> {
    let io = |source| ConnectError::Io {
        target: key.to_string(),
        source,
    };
    match key {
        PoolKey::Addr(addr) => TcpStream::connect(addr).await.map_err(io),
        PoolKey::Host(authority) => {
            let mut last = None;
            for addr in tokio::net::lookup_host(&**authority).await.map_err(io)? {
                match TcpStream::connect(addr).await {
                    Ok(s) => return Ok(s),
                    Err(e) => last = Some(e),
                }
            }
            Err(match last {
                Some(e) => io(e),
                None => ConnectError::NoAddress {
                    target: key.to_string(),
                },
            })
        }
    }
}

impl Conn {
    /// The request starts on this connection: it counts in flight on the pod, node-wide (eBPF
    /// gauge), from now. The forward phase marks it before it consumes the pick's reservation,
    /// so no concurrent pick sees the pod without either; `send` marks it again (idempotent).
    pub fn mark_busy(&self) {
        if let Some(t) = &self.inner.track {
            t.busy();
        }
    }

    /// Whether this connection carried requests before (a failure may then just mean its
    /// server closed it while it was idle).
    pub fn reused(&self) -> bool {
        self.inner.served > 0
    }

    /// Send one request and read its response head; the response body reads the rest and
    /// returns the connection to its pool at its end.
    pub async fn send(
        self,
        head: &Parts,
        lines: &[&[u8]],
        body: UpBody,
    ) -> Result<Sent, SendError> {
        let release = self.pool.map(|pool| h1::response::Release {
            pool,
            key: self.key,
        });
        self.inner.send(head, lines, body, release).await
    }
}

/// An error and its sources, joined, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
