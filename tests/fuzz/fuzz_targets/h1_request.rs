//! The proxy's own HTTP/1.1 request reading (`proxy::h1::request::parse`, then the body as the
//! connection frames it: a length, or the strict chunked decoder) against hyper's server, on
//! the same bytes.
//!
//! A client's request is where smuggling starts: if the proxy frames a body differently from
//! the server behind it, a second request hides inside the first. hyper is the reference (it
//! served the proxy's clients before). Checked:
//! - every request the proxy reads whole, hyper reads too, with the same method, target,
//!   version, header fields (those in the map and those relayed as their lines; in order among
//!   fields of one name) and body bytes;
//! - every head the proxy refuses and hyper accepts is refused for one of the stricter rules of
//!   `proxy::h1::request`, and the input shows that rule's cause (a bare LF, both framing
//!   headers, two Host lines, a second or a non-final coding, TE in HTTP/1.0);
//! - a chunked body the proxy refuses and hyper reads has a control byte or a bare LF in its
//!   framing (the proxy refuses control bytes in chunk extensions and trailers, and LF without
//!   CR everywhere; hyper takes a bare LF at the trailers' end);
//! - a body the proxy finds cut short, hyper does not read whole.
//!
//! An input that opens with empty lines (CRLF) reaches hyper without them: RFC 9112 section 2.2
//! lets a server skip them before a request line, the proxy does (httparse skips them), and
//! hyper reads no request from them on a connection's first message.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use libfuzzer_sys::fuzz_target;
use routing_userspace::proxy::h1::request::{parse, Framing, HeadError};
use routing_userspace::proxy::relayed::Relayed;
use routing_userspace::upstream::h1::chunked::{ChunkedDecoder, Decoded};
use tokio::io::AsyncWriteExt;

/// A request as read: what both sides must agree on.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Read {
    method: String,
    target: String,
    version: http::Version,
    headers: Vec<(String, Vec<u8>)>,
}

/// What the proxy made of the input.
#[derive(Debug)]
enum Ours {
    Incomplete,
    Refused(HeadError),
    Whole(Read, Vec<u8>),
    BodyCut(Read),
    BodyRefused(Read),
}

/// What hyper made of it: its first request, with its body or the body's error.
#[derive(Debug)]
enum Theirs {
    NoRequest,
    Request(Read, Result<Vec<u8>, String>),
}

/// The request as read: the map's fields and the `relayed` lines' (as `HeaderName` and
/// `HeaderValue` hold them), ordered by name (the proxy relays the lines it does not read after
/// the map's fields; the order among fields of one name is kept, and compared).
fn read_of(parts: &http::request::Parts, relayed: Option<&Relayed>) -> Read {
    let mut headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    for (name, value) in relayed.into_iter().flat_map(Relayed::fields) {
        let name = String::from_utf8(name.to_ascii_lowercase()).expect("a token is ASCII");
        headers.push((name, value.to_vec()));
    }
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Read {
        method: parts.method.as_str().to_owned(),
        target: parts.uri.to_string(),
        version: parts.version,
        headers,
    }
}

fn ours(data: &[u8]) -> Ours {
    let mut buf = BytesMut::from(data);
    let head = match parse(&mut buf) {
        Ok(Some(h)) => h,
        Ok(None) => return Ours::Incomplete,
        Err(e) => return Ours::Refused(e),
    };
    let read = read_of(&head.parts, Some(&head.relayed));
    match head.framing {
        Framing::Empty => Ours::Whole(read, Vec::new()),
        Framing::Length(n) if buf.len() as u64 >= n => {
            Ours::Whole(read, buf[..n as usize].to_vec())
        }
        Framing::Length(_) => Ours::BodyCut(read),
        Framing::Chunked => {
            let mut d = ChunkedDecoder::strict();
            let mut body = Vec::new();
            loop {
                match d.decode(&mut buf) {
                    Ok(Decoded::Data(b)) => body.extend_from_slice(&b),
                    Ok(Decoded::End) => return Ours::Whole(read, body),
                    Ok(Decoded::NeedMore) => return Ours::BodyCut(read),
                    Err(_) => return Ours::BodyRefused(read),
                }
            }
        }
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fn theirs(data: &[u8]) -> Theirs {
    let seen: Arc<Mutex<Option<Theirs>>> = Arc::new(Mutex::new(None));
    let data = data.to_vec();
    let record = Arc::clone(&seen);
    runtime().block_on(async move {
        let (mut client, server) = tokio::io::duplex(data.len() + 64 * 1024);
        client.write_all(&data).await.unwrap();
        client.shutdown().await.unwrap();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let record = Arc::clone(&record);
            async move {
                let (parts, body) = req.into_parts();
                let read = read_of(&parts, None);
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes().to_vec())
                    .map_err(|e| e.to_string());
                let mut slot = record.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(Theirs::Request(read, body));
                }
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
            }
        });
        // Half-close on: the client's side ends after the input, and hyper must still read
        // and answer the request it holds (by default it would drop it at that end).
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        drop(client);
    });
    let taken = seen.lock().unwrap().take();
    taken.unwrap_or(Theirs::NoRequest)
}

/// The head's bytes: up to its empty line.
fn head_bytes(data: &[u8]) -> &[u8] {
    let end = memchr::memmem::find(data, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| memchr::memmem::find(data, b"\n\n").map(|i| i + 2))
        .unwrap_or(data.len());
    &data[..end]
}

/// The input's header lines as (lower-case name, value), from its head's bytes: hyper's reading
/// drops a Content-Length it overrides, so the cause of a refusal is judged from the input.
fn raw_headers(data: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    head_bytes(data)
        .split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            Some((
                line[..colon].to_ascii_lowercase(),
                line[colon + 1..].trim_ascii().to_vec(),
            ))
        })
        .collect()
}

/// The input shows the cause of refusal `e` (hyper read it as `read`).
fn shows_cause(e: HeadError, data: &[u8], read: &Read) -> bool {
    let lines = raw_headers(data);
    let named = |n: &'static str| lines.iter().filter(move |(k, _)| k == n.as_bytes());
    let has = |n: &'static str| named(n).next().is_some();
    let codings: Vec<Vec<u8>> = named("transfer-encoding")
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(|c| c.trim_ascii().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    let chunked = |c: &Vec<u8>| c.as_slice() == b"chunked";
    match e {
        HeadError::BareLf => {
            let head = head_bytes(data);
            memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
        }
        HeadError::LengthAndTransferEncoding => has("content-length") && has("transfer-encoding"),
        HeadError::DuplicateHost => named("host").count() > 1,
        HeadError::ChunkedTwice => codings.iter().filter(|c| chunked(c)).count() > 1,
        HeadError::ChunkedNotLast => codings.last().is_none_or(|c| !chunked(c)),
        HeadError::UnsupportedTransferEncoding => codings.iter().any(|c| !chunked(c)),
        HeadError::TransferEncodingInHttp10 => {
            read.version == http::Version::HTTP_10 && has("transfer-encoding")
        }
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > 32 * 1024 {
        return;
    }
    let ours = ours(data);
    let mut without_empty_lines = data;
    while let Some(rest) = without_empty_lines.strip_prefix(b"\r\n") {
        without_empty_lines = rest;
    }
    let theirs = theirs(without_empty_lines);
    match (&ours, &theirs) {
        (Ours::Whole(read, body), Theirs::Request(t_read, t_body)) => {
            assert_eq!(read, t_read, "the head is read alike");
            assert_eq!(Ok(body), t_body.as_ref(), "the body is read alike");
        }
        (Ours::Whole(read, _), Theirs::NoRequest) => {
            panic!("the proxy reads a request hyper refuses: {read:?}")
        }
        (Ours::Refused(e), Theirs::Request(t_read, _)) => {
            assert!(
                shows_cause(*e, without_empty_lines, t_read),
                "refused for {e:?}, which the input does not show: {t_read:?}"
            );
        }
        (Ours::BodyCut(read), Theirs::Request(t_read, t_body)) => {
            assert_eq!(read, t_read, "the head is read alike");
            assert!(t_body.is_err(), "hyper reads whole a body the proxy finds cut");
        }
        (Ours::BodyRefused(read), Theirs::Request(t_read, t_body)) => {
            assert_eq!(read, t_read, "the head is read alike");
            if t_body.is_ok() {
                let body = &without_empty_lines[head_bytes(without_empty_lines).len()..];
                let control = body
                    .iter()
                    .any(|&b| (b < 0x20 && !matches!(b, b'\r' | b'\n' | b'\t')) || b == 0x7f);
                let bare_lf = memchr::memchr_iter(b'\n', body).any(|i| i == 0 || body[i - 1] != b'\r');
                assert!(
                    control || bare_lf,
                    "a chunked body hyper reads is refused without a control byte or a bare LF in it"
                );
            }
        }
        (Ours::BodyCut(read) | Ours::BodyRefused(read), Theirs::NoRequest) => {
            panic!("the proxy reads a head hyper refuses: {read:?}")
        }
        (Ours::Incomplete | Ours::Refused(_), Theirs::NoRequest) => {}
        (Ours::Incomplete, Theirs::Request(t_read, _)) => {
            panic!("hyper reads a head the proxy finds incomplete: {t_read:?}")
        }
    }
});
