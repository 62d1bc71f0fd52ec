//! Accept loops for the proxy and admin listeners, with graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// The client end of a connection, with what every request on it forwards (its
/// `X-Forwarded-For` value is made once per connection, not per request).
#[derive(Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    pub ip_header: http::HeaderValue,
}

/// Serve HTTP/1.1 and h2c on `listener` with `handler` until `shutdown` resolves, then let
/// open connections finish for up to `drain`.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>, Arc<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(Builder::new(TokioExecutor::new()));
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
        let handler = handler.clone();
        let client = Arc::new(Peer {
            addr: peer,
            ip_header: super::headers::client_ip_header(peer.ip()),
        });
        let service = service_fn(move |req| {
            let handler = handler.clone();
            let client = client.clone();
            async move { Ok::<_, Infallible>(handler(req, client).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!(?drain, "drain timeout; closing remaining connections"),
    }
    Ok(())
}
