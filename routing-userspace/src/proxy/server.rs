//! Accept loops for the proxy and admin listeners, with graceful drain on shutdown.
//!
//! Each client connection is served by the proxy's own HTTP/1.1 server ([`super::h1`]) or, for
//! h2c, by hyper, with a deadline for reading each request's head (slowloris), a bounded head
//! buffer, and a cap on open connections: past it, a new connection gets an OpenAI-shaped 503
//! with `Retry-After` and is closed.
//!
//! The protocol is told from the connection's first bytes, peeked, not read: a connection that
//! opens with the HTTP/2 preface goes to hyper, any other to HTTP/1. (A connection whose first
//! bytes so far are only a beginning of the preface goes to hyper-util's auto connection, which
//! reads on and decides.) The first byte must come within the header-read timeout too, so a
//! client that connects and sends nothing is closed.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus::IntCounterVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::errors::ApiError;
use super::h1;
use super::request_body::RequestBody;

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

/// Counts the clients answered with an error before any request was read (a connection past
/// the cap, a head the HTTP/1 reader refuses or that did not come in time): they never become
/// requests, so `requests_total` does not see them. Empty for a listener that does not count.
#[derive(Clone, Default)]
pub struct RefusalCounter(Option<IntCounterVec>);

impl RefusalCounter {
    pub fn new(counter: IntCounterVec) -> Self {
        Self(Some(counter))
    }

    pub fn count(&self, error: &ApiError) {
        if let Some(c) = &self.0 {
            c.with_label_values(&[error.code, error.status.as_str()])
                .inc();
        }
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

/// The first bytes of every HTTP/2 connection with prior knowledge (h2c), RFC 9113 section 3.4.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// The bytes so far are a beginning of the HTTP/2 preface: hyper-util's auto connection
    /// reads on and decides.
    Undecided,
    Http2,
}

/// The protocol of a connection that opened with `first` (nothing: the client closed, which
/// HTTP/1 then reads).
fn protocol_of(first: &[u8]) -> Protocol {
    if first.starts_with(H2_PREFACE) {
        Protocol::Http2
    } else if !first.is_empty() && H2_PREFACE.starts_with(first) {
        Protocol::Undecided
    } else {
        Protocol::Http1
    }
}

/// A response for hyper's server (HTTP/2): the fields its body carries (a pod's, relayed) go
/// into its map, the one place hyper writes fields from.
fn with_fields_in_map<B: h1::response::CarriesFields>(response: Response<B>) -> Response<B> {
    let (mut parts, mut body) = response.into_parts();
    if let Some(fields) = body.take_fields() {
        fields.append_to(&mut parts.headers);
    }
    Response::from_parts(parts, body)
}

/// Wait for the connection's first bytes (within `timeout`, unless zero) and tell its protocol
/// from them, leaving them in the socket.
async fn sniff(stream: &TcpStream, timeout: Duration) -> std::io::Result<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    let peek = stream.peek(&mut first);
    let n = if timeout.is_zero() {
        peek.await?
    } else {
        tokio::time::timeout(timeout, peek)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??
    };
    Ok(protocol_of(&first[..n]))
}

/// hyper's connection builder for the connections that open with the HTTP/2 preface or with
/// only a beginning of it: h2c, or HTTP/1.1 if the bytes that follow say so. Its HTTP/1 side
/// writes head and body as one buffer with one `send`, as the proxy's own HTTP/1 server does.
fn auto_builder(opts: &ServeOptions) -> Builder<TokioExecutor> {
    let mut auto = Builder::new(TokioExecutor::new());
    auto.http1()
        .timer(TokioTimer::new())
        .writev(false)
        .max_buf_size((opts.max_head_bytes + 16 * 1024).max(8192))
        .header_read_timeout(
            (!opts.header_read_timeout.is_zero()).then_some(opts.header_read_timeout),
        );
    auto
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
/// open connections finish for up to `opts.drain`. A handler's future is boxed per request:
/// a connection's task keeps room for what it awaits for its whole life, and the proxy's
/// request pipeline is several KB (routing, admission and the attempt loop); boxed, that memory
/// goes back when the response head is sent, not when a long stream or a keep-alive connection
/// ends.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
    counted: RefusalCounter,
) -> std::io::Result<Drained>
where
    H: Fn(Request<RequestBody>, Arc<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + h1::response::CarriesFields + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let auto = Arc::new(auto_builder(&opts));
    // Set when the loop stops: a connection still waiting for its first byte closes.
    let (stopped, stopping) = watch::channel(false);
    let open = Arc::new(AtomicUsize::new(0));
    // Each HTTP/1 connection holds a sender; the drain waits until none is left.
    let (http1_open, mut http1_closed) = mpsc::channel::<()>(1);
    let http1_settings = h1::Settings {
        header_read_timeout: opts.header_read_timeout,
        max_head_bytes: opts.max_head_bytes,
    };
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
            counted.count(&ApiError::too_many_connections());
            tokio::spawn(refuse(stream));
            continue;
        }
        let guard = Open(open.clone());
        let handler = handler.clone();
        let client = Arc::new(Peer {
            addr: peer,
            ip_header: super::headers::client_ip_header(peer.ip()),
        });
        let auto = Arc::clone(&auto);
        let watcher = graceful.watcher();
        let mut stopping = stopping.clone();
        let http1_open = http1_open.clone();
        let counted = counted.clone();
        let first_byte_timeout = opts.header_read_timeout;
        tokio::spawn(async move {
            let _guard = guard;
            let protocol = tokio::select! {
                p = sniff(&stream, first_byte_timeout) => p,
                _ = stopping.wait_for(|&stopped| stopped) => return,
            };
            let ended: Result<(), Box<dyn std::error::Error + Send + Sync>> = match protocol {
                Ok(Protocol::Http1) => {
                    let _open = http1_open;
                    let handler = move |req, peer| Box::pin(handler(req, peer));
                    h1::serve_connection(stream, handler, client, http1_settings, stopping, counted)
                        .await
                        .map_err(Into::into)
                }
                // Boxed: a task keeps room for its largest state for its whole life, and the
                // auto connection (HTTP/1 and HTTP/2 state) is several times HTTP/1's.
                Ok(Protocol::Undecided | Protocol::Http2) => {
                    drop(http1_open);
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let pipeline =
                            Box::pin(handler(req.map(RequestBody::Hyper), client.clone()));
                        async move { Ok::<_, Infallible>(with_fields_in_map(pipeline.await)) }
                    });
                    Box::pin(async move {
                        let conn = auto
                            .serve_connection(TokioIo::new(stream), service)
                            .into_owned();
                        watcher.watch(conn).await
                    })
                    .await
                }
                Err(e) => Err(e.into()),
            };
            if let Err(e) = ended {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stopped.send(true);
    drop(http1_open);
    let all_closed = async {
        graceful.shutdown().await;
        while http1_closed.recv().await.is_some() {}
    };
    Ok(tokio::select! {
        _ = all_closed => {
            tracing::info!(listener = opts.name, "all connections drained");
            Drained::All
        }
        _ = tokio::time::sleep(opts.drain) => {
            tracing::warn!(listener = opts.name, drain = ?opts.drain, "drain timeout; closing remaining connections");
            Drained::TimedOut
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::client::conn::{http1 as client1, http2 as client2};
    use tokio::sync::oneshot;

    /// `serve` on a loopback port with a handler that answers the request's HTTP version; the
    /// sender stops it, the handle says how the drain ended.
    async fn serving(
        opts: ServeOptions,
    ) -> (
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<Drained>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let handler = |req: Request<RequestBody>, _peer: Arc<Peer>| async move {
            Response::new(Full::new(Bytes::from(format!("{:?}", req.version()))))
        };
        let served = tokio::spawn(serve(
            listener,
            handler,
            async move {
                let _ = stopped.await;
            },
            opts,
            RefusalCounter::default(),
        ));
        (addr, stop, served)
    }

    fn get(addr: SocketAddr) -> Request<Full<Bytes>> {
        Request::get(format!("http://{addr}/"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    #[tokio::test]
    async fn serves_http1_and_h2c_on_one_port() {
        let (addr, stop, served) = serving(ServeOptions::default()).await;
        let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
        let (mut h1, conn) = client1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let resp = h1.send_request(get(addr)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "HTTP/1.1");

        let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
        let (mut h2, conn) = client2::handshake(TokioExecutor::new(), io).await.unwrap();
        tokio::spawn(conn);
        let resp = h2.send_request(get(addr)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "HTTP/2.0");
        drop((h1, h2));
        stop.send(()).unwrap();
        assert_eq!(served.await.unwrap().unwrap(), Drained::All);
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_is_closed_at_the_header_read_timeout() {
        let opts = ServeOptions {
            header_read_timeout: Duration::from_millis(200),
            ..ServeOptions::default()
        };
        let (addr, stop, served) = serving(opts).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
            .await
            .expect("closed within the test's patience")
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
        assert!(started.elapsed() >= Duration::from_millis(150));
        stop.send(()).unwrap();
        assert_eq!(served.await.unwrap().unwrap(), Drained::All);
    }

    #[tokio::test]
    async fn a_silent_connection_does_not_hold_up_the_drain() {
        let opts = ServeOptions {
            drain: Duration::from_secs(30),
            ..ServeOptions::default()
        };
        let (addr, stop, served) = serving(opts).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        // Accepted (and waiting for its first byte) before the stop.
        let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
        let (mut h1, conn) = client1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        h1.send_request(get(addr)).await.unwrap();
        stop.send(()).unwrap();
        let drained = tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the drain did not wait for the silent connection")
            .unwrap()
            .unwrap();
        assert_eq!(drained, Drained::All);
        let mut buf = [0u8; 8];
        assert_eq!(silent.read(&mut buf).await.unwrap_or(0), 0, "closed");
    }

    #[test]
    fn the_first_bytes_tell_http2_from_http1() {
        assert_eq!(protocol_of(H2_PREFACE), Protocol::Http2);
        assert_eq!(
            protocol_of(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04"),
            Protocol::Http2
        );
        assert_eq!(protocol_of(b"PRI * HTTP/2"), Protocol::Undecided);
        assert_eq!(protocol_of(b"P"), Protocol::Undecided);
        assert_eq!(
            protocol_of(b"POST /v1/chat/completions HTTP/1.1\r\n"),
            Protocol::Http1
        );
        assert_eq!(protocol_of(b"GET / HTTP/1.1\r\n"), Protocol::Http1);
        assert_eq!(
            protocol_of(b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n"),
            Protocol::Http1
        );
        assert_eq!(
            protocol_of(b""),
            Protocol::Http1,
            "a closed connection: HTTP/1 reads the end"
        );
    }
}
