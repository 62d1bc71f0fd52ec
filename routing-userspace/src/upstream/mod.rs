//! The upstream side: HTTP/1.1 connections to pods and Services, pooled per target.
//!
//! The proxy owns its connections instead of going through a general-purpose client, for two
//! reasons. Connecting is a step of its own, before any byte of the request exists on the
//! wire, so a failed connect can move to the next candidate with the request untouched (no
//! copy kept for a retry). And the proxy knows which connection carries which request, which
//! is what a per-connection load gauge needs (each new connection is reported to a
//! [`ConnectionHook`] once, with its socket). A connection goes back to its pool only after
//! its response body was read to the end; one whose body was abandoned is closed.

pub mod body;
pub mod pool;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub use body::UpBody;
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
    #[error("HTTP/1.1 handshake with {target}: {source}")]
    Handshake {
        target: String,
        source: hyper::Error,
    },
}

/// Why a request on an established connection failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The connection was closed before the request was written (a pooled connection the
    /// server had just closed); the request comes back untouched.
    #[error("connection closed before the request was sent")]
    NotSent(Box<Request<UpBody>>),
    /// The request failed after it was (or may have been) written.
    #[error("{}", error_chain(.0))]
    Failed(hyper::Error),
}

/// Runs once for every new upstream connection, with its socket, before the first request.
pub trait ConnectionHook: Send + Sync + 'static {
    fn connected(&self, stream: &TcpStream, peer: SocketAddr);
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
    /// Idle connections kept per target.
    pub max_idle_per_target: usize,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            keepalive: true,
            idle_timeout: Duration::from_secs(4),
            max_idle_per_target: 1024,
        }
    }
}

#[derive(Clone)]
pub struct Upstream {
    pool: Arc<Pool>,
    opts: UpstreamOptions,
    hook: Option<Arc<dyn ConnectionHook>>,
}

/// A connection ready for one request. Give it back with [`Conn::release`] once the response
/// body has been read to its end; dropping it closes the connection.
pub struct Conn {
    sender: http1::SendRequest<UpBody>,
    key: PoolKey,
    pool: Option<Arc<Pool>>,
    /// Whether it came from the pool (so a failure may just mean the server closed it).
    pub reused: bool,
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

    /// Close idle connections that aged out or were closed by their server.
    pub fn purge_idle(&self) {
        self.pool.purge();
    }

    /// A connection to `key`: a pooled idle one, else a new one.
    pub async fn acquire(&self, key: &PoolKey) -> Result<Conn, ConnectError> {
        if self.opts.keepalive {
            if let Some(sender) = self.pool.take(key) {
                return Ok(Conn {
                    sender,
                    key: key.clone(),
                    pool: Some(Arc::clone(&self.pool)),
                    reused: true,
                });
            }
        }
        self.connect(key).await
    }

    /// A new connection to `key` (never from the pool).
    pub async fn connect(&self, key: &PoolKey) -> Result<Conn, ConnectError> {
        let timeout = self.opts.connect_timeout;
        let target = || key.to_string();
        let stream = tokio::time::timeout(timeout, dial(key))
            .await
            .map_err(|_| ConnectError::Timeout {
                target: target(),
                timeout,
            })??;
        let _ = stream.set_nodelay(true);
        if let (Some(hook), Ok(peer)) = (&self.hook, stream.peer_addr()) {
            hook.connected(&stream, peer);
        }
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ConnectError::Handshake {
                target: target(),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Conn {
            sender,
            key: key.clone(),
            pool: self.opts.keepalive.then(|| Arc::clone(&self.pool)),
            reused: false,
        })
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
    /// Send one request. A pooled connection the server closed in the meantime hands the
    /// request back ([`SendError::NotSent`]) so it can go out on a fresh connection.
    pub async fn send(&mut self, req: Request<UpBody>) -> Result<Response<Incoming>, SendError> {
        if self.sender.ready().await.is_err() {
            return Err(SendError::NotSent(Box::new(req)));
        }
        match self.sender.try_send_request(req).await {
            Ok(r) => Ok(r),
            Err(mut e) => match e.take_message() {
                Some(req) => Err(SendError::NotSent(Box::new(req))),
                None => Err(SendError::Failed(e.into_error())),
            },
        }
    }

    /// The response was read to its end: the connection can carry the next request.
    pub fn release(self) {
        if let Some(pool) = self.pool {
            pool.put(self.key, self.sender);
        }
    }
}

/// An error and its sources, joined, for logs and client messages.
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
