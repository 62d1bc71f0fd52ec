//! Backends that misbehave on purpose, on loopback: one that answers every request with a fixed
//! status, one that accepts and never answers, one whose listen queue is full so that SYNs are
//! dropped silently (what a pod behind a dead node looks like).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// A running in-test backend; aborted on drop.
pub struct Backend {
    pub addr: SocketAddr,
    /// Requests it has read.
    pub requests: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Backend {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (head, then a `content-length` body) from `s`; false at EOF.
async fn read_request(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return true;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A backend on a loopback port that runs `conn` for each accepted connection, with the
/// shared request counter (`conn` counts what it reads).
async fn serve<F, Fut>(conn: F) -> Backend
where
    F: Fn(tokio::net::TcpStream, Arc<AtomicU64>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let requests = Arc::new(AtomicU64::new(0));
    let count = requests.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(conn(s, count.clone()));
        }
    });
    Backend {
        addr,
        requests,
        task,
    }
}

/// Reads until the client closes the connection (holding it open meanwhile).
async fn hold(s: &mut tokio::net::TcpStream) {
    let mut sink = [0u8; 1024];
    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// Answers every request with `status` and an OpenAI-shaped error body, keeping connections
/// alive.
pub async fn fixed_status(status: u16) -> Backend {
    serve(move |mut s, count| async move {
        let mut buf = Vec::new();
        while read_request(&mut s, &mut buf).await {
            count.fetch_add(1, Ordering::Relaxed);
            let body = format!(
                r#"{{"error":{{"message":"failing on purpose","type":"server_error","code":"{status}"}}}}"#
            );
            let head = format!(
                "HTTP/1.1 {status} Failing\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if s.write_all(head.as_bytes()).await.is_err()
                || s.write_all(body.as_bytes()).await.is_err()
            {
                return;
            }
        }
    })
    .await
}

/// Starts an SSE answer (the head and one event), then sends nothing more.
pub async fn stalling_stream() -> Backend {
    serve(|mut s, count| async move {
        let mut buf = Vec::new();
        if !read_request(&mut s, &mut buf).await {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
        let event = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
            event.len()
        );
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        hold(&mut s).await;
    })
    .await
}

/// Accepts, reads the request, and never answers (connections are held until the client
/// gives up).
pub async fn hanging() -> Backend {
    serve(|mut s, count| async move {
        let mut buf = Vec::new();
        if read_request(&mut s, &mut buf).await {
            count.fetch_add(1, Ordering::Relaxed);
        }
        hold(&mut s).await;
    })
    .await
}

/// A listener that never accepts, its queue already full: new SYNs are dropped without an
/// answer, so a connect to it waits out the client's connect timeout.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

#[allow(unsafe_code)]
pub fn blackhole() -> Blackhole {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Listening again only changes the backlog: 0 leaves room for one queued connection.
    // SAFETY: listen(2) on a socket this function owns; it reads no memory of ours.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let mut queued = Vec::new();
    while let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        queued.push(s);
        assert!(queued.len() < 64, "the listen queue never filled");
    }
    Blackhole {
        addr,
        _listener: listener,
        _queued: queued,
    }
}
