//! An OpenAI-shaped upstream that holds every chat request (for a fixed time, or until the
//! owner releases it) and counts what it holds: the proof admission tests and the admission
//! bench need that a proxy never sent a pod more than its `maxConcurrency`, in which order
//! queued requests started, and that a request answered at the proxy never reached a pod.
//!
//! Plain threads (one per connection) and blocking sockets: tens of connections at most, and
//! both the async tests and the synchronous xtask bench can drive it. `GET`s (health probes,
//! `/v1/models`) are answered at once and not counted. Each answer is a chat completion whose
//! `usage` the owner sets, so that token budgets can be corrected from it.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The request header whose value [`HoldingUpstream::started`] lists (`-` when absent).
pub const ID_HEADER: &str = "x-test-id";

/// How long a chat request is held before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A fixed service time.
    For(Duration),
    /// Until [`HoldingUpstream::release`] lets it go (one release per request).
    UntilReleased,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    max_in_flight: usize,
    requests: u64,
    /// `ID_HEADER` of each request, in the order they arrived.
    started: Vec<String>,
    /// Releases handed out and not yet taken by a held request.
    releases: u64,
    /// Every hold ends at once (set by `release_all` and on drop).
    open: bool,
    usage: (u64, u64),
}

struct Inner {
    name: String,
    hold: Hold,
    state: Mutex<State>,
    changed: Condvar,
    stopping: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running holding upstream on a loopback port; stops accepting and lets every held request
/// go when dropped.
pub struct HoldingUpstream {
    addr: SocketAddr,
    inner: Arc<Inner>,
}

impl HoldingUpstream {
    /// Listen on a free loopback port; `name` goes in each answer's `x-upstream` header.
    pub fn start(name: &str, hold: Hold) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            name: name.to_string(),
            hold,
            state: Mutex::new(State {
                usage: (10, 2),
                ..State::default()
            }),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let accept = Arc::clone(&inner);
        std::thread::Builder::new()
            .name(format!("hold-{name}"))
            .spawn(move || accept_loop(listener, accept))?;
        Ok(Self { addr, inner })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Chat requests being held now.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().in_flight
    }

    /// The most chat requests it ever held at once.
    pub fn max_in_flight(&self) -> usize {
        self.inner.lock().max_in_flight
    }

    /// Chat requests it has read.
    pub fn requests(&self) -> u64 {
        self.inner.lock().requests
    }

    /// The `x-test-id` of every chat request, in arrival order.
    pub fn started(&self) -> Vec<String> {
        self.inner.lock().started.clone()
    }

    /// Let `n` held (or future) requests answer, in the order they take the releases.
    pub fn release(&self, n: u64) {
        self.inner.lock().releases += n;
        self.inner.changed.notify_all();
    }

    /// From now on nothing is held.
    pub fn release_all(&self) {
        self.inner.lock().open = true;
        self.inner.changed.notify_all();
    }

    /// The `usage` of the next answers: prompt and completion tokens.
    pub fn set_usage(&self, prompt: u64, completion: u64) {
        self.inner.lock().usage = (prompt, completion);
    }
}

impl Drop for HoldingUpstream {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.release_all();
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let inner = Arc::clone(&inner);
        let spawned = std::thread::Builder::new()
            .name(format!("hold-{}-conn", inner.name))
            .spawn(move || {
                let _ = serve_conn(conn, &inner);
            });
        if spawned.is_err() {
            // Out of threads: the connection drops, which the proxy sees as a reset.
            continue;
        }
    }
}

/// A request's method and its `x-test-id`, its body read and dropped.
struct Head {
    method: String,
    id: String,
}

/// Read one request; `None` at a clean end of the connection.
fn read_request(r: &mut BufReader<TcpStream>) -> io::Result<Option<Head>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let method = line.split_whitespace().next().unwrap_or("").to_string();
    let (mut length, mut id) = (0usize, "-".to_string());
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                length = v.parse().unwrap_or(0);
            } else if k.eq_ignore_ascii_case(ID_HEADER) {
                id = v.to_string();
            }
        }
    }
    io::copy(&mut r.by_ref().take(length as u64), &mut io::sink())?;
    Ok(Some(Head { method, id }))
}

fn serve_conn(conn: TcpStream, inner: &Inner) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    while let Some(head) = read_request(&mut reader)? {
        let body = if head.method == "GET" {
            r#"{"object":"list","data":[]}"#.to_string()
        } else {
            held_answer(inner, head.id)
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-upstream: {}\r\ncontent-length: {}\r\n\r\n{body}",
            inner.name,
            body.len()
        );
        writer.write_all(answer.as_bytes())?;
    }
    Ok(())
}

/// Count the request in, hold it, count it out (before its answer is written, so the proxy
/// never sees the pod free before the count does), and return the answer's body.
fn held_answer(inner: &Inner, id: String) -> String {
    let mut s = inner.lock();
    s.requests += 1;
    s.in_flight += 1;
    s.max_in_flight = s.max_in_flight.max(s.in_flight);
    s.started.push(id);
    inner.changed.notify_all();
    match inner.hold {
        Hold::For(d) => {
            drop(s);
            std::thread::sleep(d);
            s = inner.lock();
        }
        Hold::UntilReleased => {
            while !s.open && s.releases == 0 {
                s = inner.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            if !s.open {
                s.releases -= 1;
            }
        }
    }
    s.in_flight -= 1;
    let (prompt, completion) = s.usage;
    drop(s);
    format!(
        r#"{{"id":"chatcmpl-hold","object":"chat.completion","model":"held","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}}}"#,
        prompt + completion
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_request;
    use std::time::Instant;

    fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "not within 10 s: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn holds_until_released_and_counts_what_it_holds() {
        let up = HoldingUpstream::start("u", Hold::UntilReleased).unwrap();
        let addr = up.addr();
        assert_eq!(
            http_request(addr, "GET", "/health", &[], b"")
                .unwrap()
                .status,
            200
        );
        let send = |id: &'static str| {
            std::thread::spawn(move || {
                http_request(
                    addr,
                    "POST",
                    "/v1/chat/completions",
                    &[(ID_HEADER, id)],
                    b"{}",
                )
                .unwrap()
            })
        };
        let a = send("a");
        until("a held", || up.in_flight() == 1);
        let b = send("b");
        until("b held", || up.in_flight() == 2);
        assert_eq!(up.started(), ["a", "b"]);
        up.set_usage(3, 4);
        up.release(1);
        until("one let go", || up.in_flight() == 1);
        up.release(1);
        for t in [a, b] {
            let r = t.join().unwrap();
            assert_eq!(r.status, 200);
            assert!(r.text().contains(r#""total_tokens":7"#), "{}", r.text());
            assert_eq!(r.header("x-upstream"), Some("u"));
        }
        assert_eq!(
            (up.requests(), up.max_in_flight(), up.in_flight()),
            (2, 2, 0)
        );
        up.release_all();
        let r = http_request(addr, "POST", "/v1/chat/completions", &[], b"{}").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(up.started(), ["a", "b", "-"]);
    }
}
