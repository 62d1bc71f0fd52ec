//! A fast SSE upstream for `bench stream`: it answers every POST with `events` OpenAI-shaped
//! `chat.completion.chunk` events (then a usage event and `data: [DONE]`), each one HTTP chunk
//! stamped with its send time, and keeps the connection open for the next request.
//!
//! Pacing: one write per event every `interval`, or back to back as fast as the socket takes
//! them (`interval` zero), or the whole answer in one write (`bulk`). One thread and one epoll
//! instance per listening port, and a timer heap of due events, so thousands of open streams
//! cost one wakeup per event, not one thread each. A client that stops reading gets its events
//! queued (and sent when the socket drains), never dropped; one that goes away is forgotten.
//! `GET /health` and `GET /v1/models` answer too (proxies and preflights probe them).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::epoll::{set_backlog, Epoll, READ, READ_WRITE};
use super::wire::{answer_end, content_event, stream_head, MODEL};
use crate::harness::os::mono_ns;

/// How every answer is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Content events per answer.
    pub events: u32,
    /// Between two events; zero: as fast as the socket takes them.
    pub interval: Duration,
    /// The whole answer in one write (interval ignored).
    pub bulk: bool,
}

const LISTENER: u64 = u64::MAX;
/// Largest request (head and body) a connection may send.
const MAX_REQUEST: usize = 1 << 20;

/// An answer being sent: the next content event's index and the answer's sequence number.
#[derive(Debug, Clone, Copy)]
struct Answer {
    next: u32,
    seq: u64,
}

struct Conn {
    sock: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    answer: Option<Answer>,
    writable_wanted: bool,
}

/// One port's server loop.
struct Server {
    ep: Epoll,
    listener: TcpListener,
    conns: HashMap<u64, Conn>,
    timers: BinaryHeap<Reverse<(u64, u64, u64)>>,
    next_token: u64,
    next_seq: u64,
    pacing: Pacing,
    name: String,
}

/// Serve `listener` forever on this thread; `name` goes in each answer's `X-Upstream`.
pub fn serve(listener: TcpListener, pacing: Pacing, name: &str) -> io::Result<()> {
    set_backlog(&listener, 4096)?;
    listener.set_nonblocking(true)?;
    let ep = Epoll::new(1024)?;
    ep.add(&listener, LISTENER, READ)?;
    let mut s = Server {
        ep,
        listener,
        conns: HashMap::new(),
        timers: BinaryHeap::new(),
        next_token: 0,
        next_seq: 0,
        pacing,
        name: name.to_owned(),
    };
    loop {
        let timeout = s.timers.peek().map_or(-1, |Reverse((due, _, _))| {
            let now = mono_ns();
            // Round up, so a timer is never polled before it is due.
            i32::try_from(due.saturating_sub(now).div_ceil(1_000_000)).unwrap_or(i32::MAX)
        });
        for r in s.ep.wait(timeout)? {
            if r.token == LISTENER {
                s.accept()?;
                continue;
            }
            if r.writable() {
                s.flush(r.token);
            }
            if r.readable() {
                s.read(r.token);
            }
        }
        s.fire_timers();
    }
}

impl Server {
    fn accept(&mut self) -> io::Result<()> {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(true)?;
                    let _ = sock.set_nodelay(true);
                    let token = self.next_token;
                    self.next_token += 1;
                    self.ep.add(&sock, token, READ)?;
                    let conn = Conn {
                        sock,
                        input: Vec::new(),
                        output: Vec::new(),
                        answer: None,
                        writable_wanted: false,
                    };
                    self.conns.insert(token, conn);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // Out of descriptors or a connection reset while queued: try again later.
                Err(_) => return Ok(()),
            }
        }
    }

    fn close(&mut self, token: u64) {
        if let Some(c) = self.conns.remove(&token) {
            let _ = self.ep.delete(&c.sock);
        }
    }

    fn read(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            match c.sock.read(&mut buf) {
                Ok(0) => return self.close(token),
                Ok(n) => {
                    c.input.extend_from_slice(&buf[..n]);
                    if n < buf.len() {
                        break; // drained; epoll reports more
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return self.close(token),
            }
        }
        if c.input.len() > MAX_REQUEST {
            return self.close(token);
        }
        self.next_request(token);
    }

    /// Start answering the next whole request in the connection's input, if no answer is on.
    fn next_request(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.answer.is_some() {
            return;
        }
        let Some((len, path, is_get)) = request_len(&c.input) else {
            return;
        };
        c.input.drain(..len);
        if is_get {
            c.output.extend_from_slice(get_answer(&path).as_bytes());
            self.flush(token);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        c.output
            .extend_from_slice(stream_head(&self.name).as_bytes());
        c.answer = Some(Answer { next: 0, seq });
        self.send_events(token);
    }

    /// Send what is due of the connection's answer: the next event (paced), events while the
    /// socket takes them (as fast as possible; resumed by [`Server::flush`] when it drains),
    /// or all of them (bulk); after the last, the end of the answer and the next request.
    fn send_events(&mut self, token: u64) {
        let pacing = self.pacing;
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let Some(mut a) = c.answer else { return };
            if a.next >= pacing.events {
                answer_end(&mut c.output, pacing.events, mono_ns());
                c.answer = None;
                if self.flush(token) {
                    self.next_request(token);
                }
                return;
            }
            content_event(&mut c.output, a.next, mono_ns());
            a.next += 1;
            c.answer = Some(a);
            if pacing.bulk {
                continue;
            }
            if !pacing.interval.is_zero() {
                let due = mono_ns() + pacing.interval.as_nanos() as u64;
                self.timers.push(Reverse((due, token, a.seq)));
                self.flush(token);
                return;
            }
            if !self.flush(token) || self.conns.get(&token).is_some_and(|c| c.writable_wanted) {
                return;
            }
        }
    }

    /// Write pending output; `false` if the connection is gone. What the socket does not take
    /// waits for EPOLLOUT (and an as-fast-as-possible answer resumes then).
    fn flush(&mut self, token: u64) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        while !c.output.is_empty() {
            match c.sock.write(&c.output) {
                Ok(n) => {
                    c.output.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.close(token);
                    return false;
                }
            }
        }
        let want = !c.output.is_empty();
        let fast = self.pacing.interval.is_zero() && !self.pacing.bulk;
        let resume = fast && !want && c.writable_wanted && c.answer.is_some();
        if want != c.writable_wanted {
            let events = if want { READ_WRITE } else { READ };
            if self.ep.modify(&c.sock, token, events).is_err() {
                self.close(token);
                return false;
            }
            c.writable_wanted = want;
        }
        if resume {
            self.send_events(token);
        }
        true
    }

    fn fire_timers(&mut self) {
        let now = mono_ns();
        while let Some(&Reverse((due, token, seq))) = self.timers.peek() {
            if due > now {
                return;
            }
            self.timers.pop();
            let current = self
                .conns
                .get(&token)
                .and_then(|c| c.answer)
                .is_some_and(|a| a.seq == seq);
            if current {
                self.send_events(token);
            }
        }
    }
}

/// The length of the first whole request in `buf` (head and Content-Length body), its path,
/// and whether it is a GET.
fn request_len(buf: &[u8]) -> Option<(usize, String, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let path = words.next().unwrap_or_default().to_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    (buf.len() >= end + length).then_some((end + length, path, method == "GET"))
}

/// The answer to a GET: health, the model list, or 404.
fn get_answer(path: &str) -> String {
    let body = match path {
        "/health" => r#"{"status":"ok"}"#.to_owned(),
        "/v1/models" => format!(
            r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model","owned_by":"bench"}}]}}"#
        ),
        _ => {
            return "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned();
        }
    };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests;
