//! The upstream HTTP/1.1 client.
//!
//! Two modes: keep-alive pooling (the default with the userspace gauge), or one fresh
//! connection per request (while the eBPF connection gauge drives picks, so that an open
//! connection to a pod means a request in flight there). A failure to connect is reported
//! apart from other failures: only it may be retried on another target, because no byte of the
//! request has left then.
//!
//! With one connection per request and the eBPF gauge, the kernel counts a connection the moment
//! it is established; an optional hook runs right then, so a least-loaded reservation is
//! replaced by the tracked connection at exactly that point, not before.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower_service::Service;

/// Called with the peer address of every new upstream connection.
pub type OnConnect = Arc<dyn Fn(SocketAddr) + Send + Sync>;

/// `HttpConnector` plus the connect hook.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    on_connect: Option<OnConnect>,
}

impl Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        let hook = self.on_connect.clone();
        Box::pin(async move {
            let io = connecting.await?;
            if let (Some(hook), Ok(peer)) = (hook, io.inner().peer_addr()) {
                hook(peer);
            }
            Ok(io)
        })
    }
}

#[derive(Debug)]
pub enum SendError {
    /// The connection could not be made; nothing was sent.
    Connect(String),
    /// The request failed after the connection was made.
    Failed(String),
}

#[derive(Clone)]
pub struct Upstream {
    client: Client<Connector, Full<Bytes>>,
    keepalive: bool,
    hooked: bool,
}

impl Upstream {
    /// `on_connect` runs for every new connection (see the module doc).
    pub fn new(connect_timeout: Duration, keepalive: bool, on_connect: Option<OnConnect>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(60));
        if !keepalive {
            builder.pool_max_idle_per_host(0);
        }
        Self {
            hooked: on_connect.is_some(),
            client: builder.build(Connector {
                http: connector,
                on_connect,
            }),
            keepalive,
        }
    }

    /// Whether new connections run the connect hook.
    pub fn hooked(&self) -> bool {
        self.hooked
    }

    pub fn keepalive(&self) -> bool {
        self.keepalive
    }

    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, SendError> {
        self.client.request(req).await.map_err(|e| {
            let detail = error_chain(&e);
            if e.is_connect() {
                SendError::Connect(detail)
            } else {
                SendError::Failed(detail)
            }
        })
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
