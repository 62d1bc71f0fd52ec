//! A counting forwarder in front of each model server: it counts the completions it passes
//! back, so requests per server are counted alike for every router, and notes which requests
//! reached its server (the number in each workload's user message), so the samples say where
//! each request went.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;

/// One forwarder: its address, the completions it passed back, and the request numbers it saw.
pub(super) struct Forwarder {
    pub front: SocketAddr,
    pub count: Arc<AtomicU64>,
    pub asked: Arc<Mutex<Vec<usize>>>,
}

/// A forwarder in front of `server` that counts the streamed chat completions it passes back
/// (each ends with one `data: [DONE]` event; health checks and requests a router resent on a
/// fresh connection are not counted twice).
pub(super) fn counting_forwarder(server: SocketAddr) -> Result<Forwarder> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let front = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let (c, a) = (Arc::clone(&count), Arc::clone(&asked));
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
            let (c, a) = (Arc::clone(&c), Arc::clone(&a));
            std::thread::spawn(move || copy_noting(client, upstream, &a));
            std::thread::spawn(move || copy_counting(upstream_r, client_w, &c));
        }
    });
    Ok(Forwarder {
        front,
        count,
        asked,
    })
}

/// What precedes the request number in the workloads' user messages ("Question 17: ...",
/// "User 17 asks: ...").
const MARKERS: [&[u8]; 2] = [b"Question ", b"User "];

/// Note the request numbers in `window` (bytes on their way to the server), keeping what may
/// still be cut: a marker or a number the next read continues.
fn note_requests(window: &mut Vec<u8>, asked: &Mutex<Vec<usize>>) {
    let find = |from: usize, m: &[u8]| {
        window[from..]
            .windows(m.len())
            .position(|w| w == m)
            .map(|p| (from + p, m.len()))
    };
    let mut done = 0;
    while let Some((at, len)) = MARKERS.iter().filter_map(|m| find(done, m)).min() {
        let start = at + len;
        let digits = window[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if start + digits == window.len() {
            // The number may go on in the next read.
            window.drain(..at);
            return;
        }
        let number = std::str::from_utf8(&window[start..start + digits])
            .ok()
            .and_then(|d| d.parse().ok());
        if let Some(n) = number {
            asked.lock().unwrap_or_else(|e| e.into_inner()).push(n);
        }
        done = start + digits;
    }
    // A marker's first bytes may end the window.
    let keep = (window.len() - done).min(16);
    window.drain(..window.len() - keep);
}

fn copy_noting(mut from: TcpStream, mut to: TcpStream, asked: &Mutex<Vec<usize>>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut window = Vec::new();
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        window.extend_from_slice(&buf[..n]);
        note_requests(&mut window, asked);
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_are_noted_across_reads() {
        let asked = Mutex::new(Vec::new());
        let mut window = Vec::new();
        let body =
            br#"{"content":"Question 17: what?"} {"content":"User 3 asks: which"} Question 204: x"#;
        // Every cut of the stream into two reads notes the same numbers.
        for cut in 0..body.len() {
            asked.lock().unwrap().clear();
            window.clear();
            for part in [&body[..cut], &body[cut..]] {
                window.extend_from_slice(part);
                note_requests(&mut window, &asked);
            }
            assert_eq!(*asked.lock().unwrap(), [17, 3, 204], "cut at {cut}");
        }
    }
}
