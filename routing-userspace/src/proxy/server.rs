//! Accept loops for the proxy and admin listeners, with graceful drain on shutdown.
//!
//! Each client connection is served by hyper (HTTP/1.1, or h2c), with a deadline for reading
//! each request's head (slowloris), a bounded head buffer, and a cap on open connections: past
//! it, a new connection gets an OpenAI-shaped 503 with `Retry-After` and is closed.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::errors::ApiError;

/// The client end of a connection, with what every request on it forwards (its
/// `X-Forwarded-For` value is made once per connection, not per request).
#[derive(Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    pub ip_header: http::HeaderValue,
}

/// How a listener treats its clients.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// The listener's name in its log lines (`proxy`, `admin`).
    pub name: &'static str,
    /// After shutdown, how long open connections may finish.
    pub drain: Duration,
    /// A request head must arrive within this (0: no limit).
    pub header_read_timeout: Duration,
    /// Largest request head hyper buffers (it answers 431 past it).
    pub max_head_bytes: usize,
    /// Connections served at once.
    pub max_connections: usize,
}

impl ServeOptions {
    /// The proxy listener's defaults (each a `serve` flag).
    pub const PROXY: Self = Self {
        name: "proxy",
        drain: Duration::from_secs(30),
        header_read_timeout: Duration::from_secs(30),
        max_head_bytes: 64 * 1024,
        max_connections: 16_384,
    };

    /// The admin listener (metrics, probes, `/debug/routing`): a short drain.
    pub const ADMIN: Self = Self {
        name: "admin",
        drain: Duration::from_secs(1),
        ..Self::PROXY
    };
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self::ADMIN
    }
}

/// Counts a connection as open until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answer a connection past the cap: 503, `Retry-After`, closed.
async fn refuse(mut stream: TcpStream) {
    let body = ApiError::too_many_connections().body();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
    // Read what the client sent (briefly), so closing does not reset the connection under it.
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// hyper's connection builder (HTTP/1.1 and h2c) for `opts`.
fn connection_builder(opts: &ServeOptions) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    let mut h1 = builder.http1();
    // Head and body (or chunk framing and data) go out as one buffer with one `send`, not a
    // `writev` of several: 14.7 against 15.2 us of CPU per request, 3% more requests per second
    // (`cargo xtask bench overhead --only haproxy,fx-userspace,session`). The copy it costs is
    // small next to a model's time for the bodies it copies.
    h1.timer(TokioTimer::new())
        .writev(false)
        .max_buf_size((opts.max_head_bytes + 16 * 1024).max(8192));
    h1.header_read_timeout(
        (!opts.header_read_timeout.is_zero()).then_some(opts.header_read_timeout),
    );
    builder
}

/// Connections refused past the limit: one warning per ten seconds of them, not one each.
#[derive(Default)]
struct Refusals {
    since_warned: u64,
    last_warned: Option<Instant>,
}

impl Refusals {
    fn refused(&mut self, peer: SocketAddr, max: usize) {
        self.since_warned += 1;
        if self
            .last_warned
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(peer = %peer, max, refused = self.since_warned, "too many client connections; refusing new ones with 503");
            self.last_warned = Some(Instant::now());
            self.since_warned = 0;
        }
    }
}

/// How the drain after shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every connection finished.
    All,
    /// The drain timeout passed with connections still open (their tasks still run).
    TimedOut,
}

/// Serve HTTP/1.1 and h2c on `listener` with `handler` until `shutdown` resolves, then let
/// open connections finish for up to `opts.drain`.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
) -> std::io::Result<Drained>
where
    H: Fn(Request<Incoming>, Arc<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(connection_builder(&opts));
    let open = Arc::new(AtomicUsize::new(0));
    let mut refusals = Refusals::default();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        if open.fetch_add(1, Ordering::Relaxed) >= opts.max_connections {
            open.fetch_sub(1, Ordering::Relaxed);
            refusals.refused(peer, opts.max_connections);
            tokio::spawn(refuse(stream));
            continue;
        }
        let guard = Open(open.clone());
        let handler = handler.clone();
        let client = Arc::new(Peer {
            addr: peer,
            ip_header: super::headers::client_ip_header(peer.ip()),
        });
        let service = service_fn(move |req| {
            // Boxed per request: hyper keeps a slot the size of the service future for the
            // connection's whole life, and the request pipeline's future is ~6.5 KB (its
            // awaits hold routing, admission and the attempt loop). Boxed, the slot is a
            // pointer, and the pipeline's memory goes back when the response head is sent,
            // not when a long stream or a keep-alive connection ends.
            let pipeline = Box::pin(handler(req, client.clone()));
            async move { Ok::<_, Infallible>(pipeline.await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = conn.await {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    Ok(tokio::select! {
        _ = graceful.shutdown() => {
            tracing::info!(listener = opts.name, "all connections drained");
            Drained::All
        }
        _ = tokio::time::sleep(opts.drain) => {
            tracing::warn!(listener = opts.name, drain = ?opts.drain, "drain timeout; closing remaining connections");
            Drained::TimedOut
        }
    })
}
