//! The upstream HTTP/1.1 client.
//!
//! Two modes: keep-alive pooling (the default with the userspace gauge), or one fresh
//! connection per request (while the eBPF connection gauge drives picks, so that an open
//! connection to a pod means a request in flight there). A failure to connect is reported
//! apart from other failures: only it may be retried on another target, because no byte of the
//! request has left then.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Debug)]
pub enum SendError {
    /// The connection could not be made; nothing was sent.
    Connect(String),
    /// The request failed after the connection was made.
    Failed(String),
}

#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    keepalive: bool,
}

impl Upstream {
    pub fn new(connect_timeout: Duration, keepalive: bool) -> Self {
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
            client: builder.build(connector),
            keepalive,
        }
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
