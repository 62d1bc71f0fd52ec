//! A stand-in for a Kubernetes Service on this machine: an L4 balancer that sends each new TCP
//! connection to the next backend, as kube-proxy does per connection. It carries the demo's
//! "default routing" baseline; the proxy's own strategies never use it except as the fallback.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

/// Accept on `listener` forever, splicing each connection to a backend in turn.
pub(super) async fn run(listener: TcpListener, backends: Vec<SocketAddr>) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let backends = backends.clone();
        let next = next.clone();
        tokio::spawn(async move {
            let i = next.fetch_add(1, Ordering::Relaxed) % backends.len();
            if let Ok(mut upstream) = TcpStream::connect(backends[i]).await {
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        });
    }
}
