//! Loopback plumbing: free ports, waiting for a listener or an HTTP 200, and a tiny blocking
//! HTTP/1.1 client for readiness checks and pre-flight requests (not for load: wrk does that).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding 127.0.0.1:0")
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn timed_out(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

/// Wait until something accepts TCP connections on `addr`.
pub fn wait_port(addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(timed_out(format!(
                "nothing listens on {addr} after {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Wait until `GET path` on `addr` answers 200.
pub fn wait_http_ok(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match http_request(addr, "GET", path, &[], b"") {
            Ok(r) if r.status == 200 => return Ok(()),
            Ok(r) => format!("status {}", r.status),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(timed_out(format!(
                "GET {addr}{path} did not answer 200 within {timeout:?} (last: {last})"
            )));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A buffered HTTP response.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, with chunked transfer coding undone.
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 exchange on a new connection (`Connection: close`, 10 s timeouts). A non-empty
/// `body` is sent as `application/json`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<HttpReply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Writes `request` as is (any bytes, any framing) on a new connection and reads until the
/// server closes it or `wait` passes. `Ok(None)`: the server closed without answering.
pub fn raw_exchange(
    addr: SocketAddr,
    request: &[u8],
    wait: Duration,
) -> io::Result<Option<HttpReply>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(wait))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            // Kept open past `wait`: answer with what arrived (a keep-alive reply is complete).
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if raw.is_empty() {
                    return Err(timed_out(format!("no answer from {addr} within {wait:?}")));
                }
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if raw.is_empty() {
        return Ok(None);
    }
    parse_response(&raw).map(Some)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// An HTTP/1.1 response read whole (head, then the body with chunked coding undone).
pub fn parse_response(raw: &[u8]) -> io::Result<HttpReply> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            bad(format!(
                "no end of head in {:?}",
                String::from_utf8_lossy(raw)
            ))
        })?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad(format!("no status in {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(HttpReply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("chunk size line without CRLF".into()))?;
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| bad(format!("bad chunk size {size_hex:?}")))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err(bad("truncated chunk".into()));
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let r = parse_response(b"HTTP/1.1 201 Created\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok")
            .unwrap();
        assert_eq!(
            (r.status, r.header("x-a"), r.text().as_str()),
            (201, Some("1"), "ok")
        );
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nflex\r\n5;x=y\r\ninfer\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.text(), "flexinfer");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab")
                .is_err()
        );
    }

    #[test]
    fn talks_to_a_real_listener_and_waits_for_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            // wait_port's probe connects and closes without a request: skip such connections.
            let answers = ["503 Busy", "200 OK"];
            let mut next = 0;
            while next < answers.len() {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    continue;
                }
                let status = answers[next];
                next += 1;
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /ready HTTP/1.1"));
                write!(s, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").unwrap();
            }
        });
        wait_port(addr, Duration::from_secs(5)).unwrap();
        // The first GET gets the 503, the retry the 200.
        wait_http_ok(addr, "/ready", Duration::from_secs(5)).unwrap();
        server.join().unwrap();
        let gone = loopback(free_port());
        assert!(wait_port(gone, Duration::from_millis(100)).is_err());
    }
}
