//! One blocking HTTP/1.1 client for the harness: write a request, read a response head, read
//! a body framed by Content-Length, chunked coding or the end of the connection, and read an
//! SSE body event by event with the time each event arrived.
//!
//! It is a measuring and checking tool, not a general client: one request at a time on a
//! connection, no redirects, no TLS, no 1xx handling. What it is strict about is what the
//! callers judge: whether a body reached the end its framing promises (a soak counts a stream
//! cut by a killed pod as such), and which read failed (no head, a bad status line, a reset).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A request to write: `Content-Length` is always sent, `Content-Type: application/json` with a
/// non-empty body unless a header sets it, `Connection: close` when `close`.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(&'a str, &'a str)>,
    pub body: &'a [u8],
    pub close: bool,
}

impl<'a> Request<'a> {
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            headers: Vec::new(),
            body: b"",
            close: true,
        }
    }

    pub fn get(path: &'a str) -> Self {
        Self::new("GET", path)
    }

    pub fn post(path: &'a str, body: &'a [u8]) -> Self {
        Self {
            body,
            ..Self::new("POST", path)
        }
    }

    pub fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Leave the connection open after the response (for the next request on it).
    pub fn keep_alive(mut self) -> Self {
        self.close = false;
        self
    }

    /// The request head and body as bytes, with `host` in the Host header.
    pub fn encode(&self, host: &str) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\nHost: {host}\r\n", self.method, self.path);
        if self.close {
            head.push_str("Connection: close\r\n");
        }
        let typed = self
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
        if !self.body.is_empty() && !typed {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(self.body);
        out
    }
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// No length and no chunking: the body runs until the server closes.
    UntilClose,
}

/// A response head: the status and the headers (names lower-cased, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body's framing (RFC 9112 section 6.3, for answers to methods other than HEAD).
    pub fn framing(&self) -> Framing {
        if matches!(self.status, 100..=199 | 204 | 304) {
            return Framing::Length(0);
        }
        let chunked = self
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            return Framing::Chunked;
        }
        match self
            .header("content-length")
            .and_then(|v| v.trim().parse().ok())
        {
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Read a response head. A connection closed before a whole head is `UnexpectedEof` ("closed
/// before the head"); a status line that is not one is `InvalidData` ("bad status line ...").
pub fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let mut line = Vec::new();
    let mut status = None;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 || !line.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before the head",
            ));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        let Some(code) = status else {
            let code = text
                .strip_prefix("HTTP/1.")
                .and_then(|t| t.split_whitespace().nth(1))
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| invalid(format!("bad status line {text:?}")))?;
            status = Some(code);
            continue;
        };
        if text.is_empty() {
            return Ok(Head {
                status: code,
                headers,
            });
        }
        if let Some((k, v)) = text.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    ChunkStart,
    ChunkData(u64),
    UntilClose,
    Done,
}

/// A body as a [`Read`]er with the framing undone. A read returns what one read of the
/// connection brought (never waits for more than one chunk's worth), `Ok(0)` at the end;
/// [`Body::complete`] then tells whether that end was the one the framing promised.
/// Malformed chunked framing is an `InvalidData` error.
pub struct Body<'r, R> {
    r: &'r mut R,
    state: State,
    complete: bool,
}

impl<'r, R: BufRead> Body<'r, R> {
    pub fn new(r: &'r mut R, framing: Framing) -> Self {
        let state = match framing {
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkStart,
            Framing::UntilClose => State::UntilClose,
        };
        Self {
            r,
            state,
            complete: false,
        }
    }

    /// Whether the body reached the end its framing promised.
    pub fn complete(&self) -> bool {
        self.complete
    }

    fn line(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        Ok(line.ends_with(b"\n").then_some(line))
    }

    /// Past the chunk size line: the next state, or `None` at a cut.
    fn chunk_start(&mut self) -> io::Result<Option<State>> {
        let Some(line) = self.line()? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&line);
        let hex = text.split(';').next().unwrap_or_default().trim();
        let size =
            u64::from_str_radix(hex, 16).map_err(|_| invalid(format!("bad chunk size {hex:?}")))?;
        if size > 0 {
            return Ok(Some(State::ChunkData(size)));
        }
        // Trailers until the empty line.
        loop {
            match self.line()? {
                None => return Ok(None),
                Some(l) if l == b"\r\n" || l == b"\n" => {
                    self.complete = true;
                    return Ok(Some(State::Done));
                }
                Some(_) => {}
            }
        }
    }

    fn read_data(&mut self, buf: &mut [u8], left: u64) -> io::Result<usize> {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.r.read(&mut buf[..want])?;
        if n == 0 {
            self.state = State::Done; // cut: incomplete
            return Ok(0);
        }
        let left = left - n as u64;
        self.state = match self.state {
            State::Length(_) if left == 0 => {
                self.complete = true;
                State::Done
            }
            State::Length(_) => State::Length(left),
            _ if left > 0 => State::ChunkData(left),
            _ => match self.line()? {
                Some(l) if l == b"\r\n" => State::ChunkStart,
                Some(l) => return Err(invalid(format!("chunk ends with {l:?}, not CRLF"))),
                None => State::Done,
            },
        };
        Ok(n)
    }
}

impl<R: BufRead> Read for Body<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.state {
                State::Done => return Ok(0),
                State::Length(0) => {
                    self.complete = true;
                    self.state = State::Done;
                }
                State::Length(left) | State::ChunkData(left) => return self.read_data(buf, left),
                State::ChunkStart => self.state = self.chunk_start()?.unwrap_or(State::Done),
                State::UntilClose => {
                    let n = self.r.read(buf)?;
                    if n == 0 {
                        self.complete = true;
                        self.state = State::Done;
                    }
                    return Ok(n);
                }
            }
        }
    }
}

/// Read a whole body into `out`; `Ok(true)` when it reached its promised end.
pub fn read_body(r: &mut impl BufRead, framing: Framing, out: &mut Vec<u8>) -> io::Result<bool> {
    let mut body = Body::new(r, framing);
    body.read_to_end(out)?;
    Ok(body.complete())
}

/// A buffered response: head, body, and whether the body reached its promised end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, with chunked coding undone.
    pub body: Vec<u8>,
    pub complete: bool,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One server-sent event: its `event:` name (if any), its `data:` lines joined by newlines,
/// and when the read that completed it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
    pub at: Instant,
}

/// The end of the first event in `buf` (the index past its blank line).
pub fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The `event:` and `data:` fields of one event's text (comments and other fields skipped).
pub fn parse_event(text: &str) -> (Option<String>, String) {
    let mut event = None;
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = Some(value.to_owned()),
            "data" => data.push(value),
            _ => {}
        }
    }
    (event, data.join("\n"))
}

/// Reads a body event by event. At the end, [`SseReader::complete`] says whether the body
/// reached its promised end; bytes after the last blank line are dropped.
pub struct SseReader<'r, R> {
    body: Body<'r, R>,
    buf: Vec<u8>,
    chunk: Vec<u8>,
}

impl<'r, R: BufRead> SseReader<'r, R> {
    pub fn new(body: Body<'r, R>) -> Self {
        Self {
            body,
            buf: Vec::new(),
            chunk: vec![0; 16 * 1024],
        }
    }

    pub fn next_event(&mut self) -> io::Result<Option<SseEvent>> {
        let mut at = Instant::now();
        loop {
            if let Some(end) = event_end(&self.buf) {
                let raw: Vec<u8> = self.buf.drain(..end).collect();
                let (event, data) = parse_event(&String::from_utf8_lossy(&raw));
                return Ok(Some(SseEvent { event, data, at }));
            }
            let n = self.body.read(&mut self.chunk)?;
            if n == 0 {
                return Ok(None);
            }
            at = Instant::now();
            self.buf.extend_from_slice(&self.chunk[..n]);
        }
    }

    pub fn complete(&self) -> bool {
        self.body.complete()
    }
}

/// Timeouts of a [`Conn`].
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// Of each read: a server silent this long fails the read with `WouldBlock`/`TimedOut`.
    pub read: Duration,
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(10),
            write: Duration::from_secs(10),
        }
    }
}

/// One client connection.
pub struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connect (with `TCP_NODELAY`: requests go out whole, at once).
    pub fn connect(addr: SocketAddr, t: Timeouts) -> io::Result<Self> {
        let s = TcpStream::connect_timeout(&addr, t.connect)?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(t.read))?;
        s.set_write_timeout(Some(t.write))?;
        Ok(Self {
            addr,
            reader: BufReader::with_capacity(16 * 1024, s),
        })
    }

    pub fn send(&mut self, req: &Request) -> io::Result<()> {
        self.reader
            .get_mut()
            .write_all(&req.encode(&self.addr.to_string()))
    }

    pub fn head(&mut self) -> io::Result<Head> {
        read_head(&mut self.reader)
    }

    /// The body of the response whose head was just read.
    pub fn body(&mut self, head: &Head) -> Body<'_, BufReader<TcpStream>> {
        Body::new(&mut self.reader, head.framing())
    }

    /// The body of the response whose head was just read, event by event.
    pub fn events(&mut self, head: &Head) -> SseReader<'_, BufReader<TcpStream>> {
        SseReader::new(self.body(head))
    }

    /// The rest of the response whose head was just read, buffered. A read error ends the
    /// body (as a cut) rather than the reply: what arrived is kept.
    pub fn reply(&mut self, head: Head) -> Reply {
        let mut body = Vec::new();
        let complete = read_body(&mut self.reader, head.framing(), &mut body).unwrap_or(false);
        Reply {
            status: head.status,
            headers: head.headers,
            body,
            complete,
        }
    }

    /// Send `req` and read the whole response.
    pub fn exchange(&mut self, req: &Request) -> io::Result<Reply> {
        self.send(req)?;
        let head = self.head()?;
        Ok(self.reply(head))
    }
}

/// A response read whole from bytes (head, then the body with chunked coding undone). A chunked
/// body that stops before its last chunk is an error; other bodies are what arrived.
pub fn parse_response(raw: &[u8]) -> io::Result<Reply> {
    let mut r = raw;
    let head = read_head(&mut r).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => invalid(format!(
            "no end of head in {:?}",
            String::from_utf8_lossy(raw)
        )),
        _ => e,
    })?;
    let framing = head.framing();
    let mut body = Vec::new();
    let complete = read_body(&mut r, framing, &mut body)?;
    if framing == Framing::Chunked && !complete {
        return Err(invalid("truncated chunk".into()));
    }
    Ok(Reply {
        status: head.status,
        headers: head.headers,
        body,
        complete,
    })
}

#[cfg(test)]
mod tests;
