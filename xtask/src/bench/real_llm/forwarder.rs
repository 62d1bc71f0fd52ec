//! A counting forwarder in front of each model server: it counts the completions it passes
//! back, so requests per server are counted alike for every router.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;

/// A forwarder in front of `server` that counts the streamed chat completions it passes back
/// (each ends with one `data: [DONE]` event; health checks and requests a router resent on a
/// fresh connection are not counted twice).
pub(super) fn counting_forwarder(server: SocketAddr) -> Result<(SocketAddr, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let front = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&count);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(upstream) = TcpStream::connect(server) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (Ok(client_w), Ok(upstream_r)) = (client.try_clone(), upstream.try_clone()) else {
                continue;
            };
            let c = Arc::clone(&c);
            std::thread::spawn(move || copy(client, upstream));
            std::thread::spawn(move || copy_counting(upstream_r, client_w, &c));
        }
    });
    Ok((front, count))
}

const DONE: &[u8] = b"data: [DONE]";

fn copy_counting(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail: Vec<u8> = Vec::new();
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        let hits = tail.windows(DONE.len()).filter(|w| *w == DONE).count();
        count.fetch_add(hits as u64, Ordering::Relaxed);
        let keep = tail.len().min(DONE.len() - 1);
        tail.drain(..tail.len() - keep);
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}
