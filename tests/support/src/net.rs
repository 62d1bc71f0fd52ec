//! Loopback plumbing: free ports, waiting for a listener or an HTTP 200, and one-shot requests
//! for readiness checks and pre-flight requests, on the harness's HTTP/1.1 client
//! ([`crate::harness::http`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::http::{parse_response, Conn, Request, Timeouts};

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

/// A buffered HTTP response (the harness client's [`Reply`](crate::harness::http::Reply)).
pub type HttpReply = crate::harness::http::Reply;

/// One HTTP/1.1 exchange on a new connection (`Connection: close`, 10 s timeouts). A non-empty
/// `body` is sent as `application/json`. A chunked body cut before its end is an error.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<HttpReply> {
    let mut req = Request::new(method, path);
    req.body = body;
    req.headers = headers.to_vec();
    let mut conn = Conn::connect(addr, Timeouts::default())?;
    let reply = conn.exchange(&req)?;
    let chunked = reply
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked && !reply.complete {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{method} {addr}{path}: the chunked body was cut"),
        ));
    }
    Ok(reply)
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

#[cfg(test)]
mod tests {
    use super::*;

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
