//! The upstream HTTP/1.1 response head parser (`upstream::h1::head::parse_response`), fed the
//! way the connection feeds it: bytes arrive in reads of any size and the parser is called
//! after each one, on what the buffer holds.
//!
//! A pod is trusted to route to, not to be well-formed, so its response head must never panic
//! the proxy or be read two ways. Checked, for the request methods GET, POST and HEAD and under
//! three split patterns (all at once, byte by byte, pseudo-random): the outcome is the same
//! however the bytes were split; the head consumed is a prefix of the input and what follows
//! stays in the buffer untouched; header values are bytes of the input; framing follows the
//! headers (no body for HEAD, 204 and 304; chunked beats Content-Length; a body delimited by
//! the close never keeps the connection); no hop-by-hop header is among the fields relayed
//! (they are read from the head's lines); every field relayed is one that `HeaderName` and
//! `HeaderValue` accept (the relay writes them without another check); and the head the proxy
//! writes for its client from them (`proxy::h1::response::write_head`, each field relayed as
//! its line) reads back, with httparse, as the same fields.
#![no_main]

use bytes::BytesMut;
use flexinfer_fuzz::split_patterns;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Version;
use routing_userspace::proxy::h1::response::{write_head, Asked};
use routing_userspace::upstream::h1::fields::Fields;
use http::{header, Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use routing_userspace::upstream::h1::head::{
    hop_by_hop, parse_response, Framing, HeadError, ResponseHead,
};

/// What parsing the input produced, comparable across split patterns.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Not a complete head (yet).
    Incomplete,
    Head {
        status: StatusCode,
        headers: Vec<(String, Vec<u8>)>,
        framing: Framing,
        keep_alive: bool,
        /// Bytes left in the buffer after the head.
        rest: Vec<u8>,
    },
    Error(HeadError),
}

fn outcome(head: ResponseHead, rest: &[u8]) -> Outcome {
    Outcome::Head {
        status: head.status,
        headers: head
            .fields
            .iter()
            .map(|(n, v)| {
                assert!(HeaderName::from_bytes(n).is_ok(), "name {n:?} relayed");
                assert!(HeaderValue::from_bytes(v).is_ok(), "value {v:?} relayed");
                (String::from_utf8_lossy(n).into_owned(), v.to_vec())
            })
            .collect(),
        framing: head.framing,
        keep_alive: head.keep_alive,
        rest: rest.to_vec(),
    }
}

/// Feed `data` in pieces of `lengths`, calling the parser after each piece.
fn feed(data: &[u8], lengths: &[usize], method: &Method) -> Outcome {
    let mut buf = BytesMut::new();
    let mut at = 0;
    for &n in lengths {
        buf.extend_from_slice(&data[at..at + n]);
        at += n;
        match parse_response(&mut buf, method) {
            Ok(None) => {}
            Ok(Some(head)) => {
                relays_faithfully(head.status, &head.fields);
                // The rest of the input would arrive in the same buffer.
                buf.extend_from_slice(&data[at..]);
                return outcome(head, &buf);
            }
            Err(e) => return Outcome::Error(e),
        }
    }
    Outcome::Incomplete
}

/// Fields the client's head writes from what they say, not as they came.
fn rewritten(name: &str) -> bool {
    [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::DATE,
    ]
    .iter()
    .any(|h| h.as_str() == name)
}

/// The fields as (lowercase name, value), without those the proxy rewrites.
fn relayed(fields: impl Iterator<Item = (String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    fields.filter(|(n, _)| !rewritten(n)).collect()
}

/// The head written for the client from `fields` holds the same fields, read by httparse.
fn relays_faithfully(status: StatusCode, fields: &Fields) {
    let mut out = Vec::new();
    let asked = Asked {
        head_method: false,
        version: Version::HTTP_11,
        keep_alive: true,
    };
    write_head(&mut out, status, &HeaderMap::new(), Some(fields), None, asked);
    let mut lines = [httparse::EMPTY_HEADER; 200];
    let mut r = httparse::Response::new(&mut lines);
    let parsed = r.parse(&out);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
        "the written head reads back whole: {parsed:?}\n{}",
        String::from_utf8_lossy(&out)
    );
    let lower = |n: &[u8]| String::from_utf8_lossy(n).to_ascii_lowercase();
    let sent = relayed(fields.iter().map(|(n, v)| (lower(n), v.to_vec())));
    let read = relayed(r.headers.iter().map(|h| (lower(h.name.as_bytes()), h.value.to_vec())));
    assert_eq!(read, sent, "{}", String::from_utf8_lossy(&out));
}

fn check_head(data: &[u8], method: &Method, o: &Outcome) {
    let Outcome::Head {
        status,
        headers,
        framing,
        keep_alive,
        rest,
    } = o
    else {
        return;
    };
    assert!(data.ends_with(rest), "the body is what follows the head");
    let head = &data[..data.len() - rest.len()];
    assert!(head.ends_with(b"\n"), "a head ends with its empty line");
    assert!(!status.is_informational(), "interim responses are skipped");
    for (name, value) in headers {
        assert!(
            value.is_empty() || head.windows(value.len()).any(|w| w == value.as_slice()),
            "the value of {name} is not in the head"
        );
    }
    for (name, _) in headers {
        assert!(
            hop_by_hop(name.as_bytes()).is_none(),
            "{name} is hop-by-hop"
        );
    }
    // The final head's lines (interim heads come before it; no header line starts with
    // `HTTP/`, a name cannot hold `/`), and whether one of them is the header `n`.
    let lines: Vec<&[u8]> = head.split(|&b| b == b'\n').collect();
    let last_status = lines
        .iter()
        .rposition(|l| l.starts_with(b"HTTP/"))
        .unwrap_or(0);
    let has = |n: &str| {
        lines[last_status + 1..].iter().any(|l| {
            l.iter()
                .position(|&b| b == b':')
                .is_some_and(|colon| l[..colon].eq_ignore_ascii_case(n.as_bytes()))
        })
    };
    let bodyless = *method == Method::HEAD
        || *status == StatusCode::NO_CONTENT
        || *status == StatusCode::NOT_MODIFIED;
    if bodyless {
        assert_eq!(*framing, Framing::Empty);
    } else if has(header::TRANSFER_ENCODING.as_str()) {
        assert!(
            matches!(framing, Framing::Chunked | Framing::Close),
            "{framing:?}"
        );
    } else if !has(header::CONTENT_LENGTH.as_str()) {
        assert_eq!(*framing, Framing::Close);
    }
    if let Framing::Length(n) = framing {
        assert!(*n > 0, "a zero length is Empty");
    }
    if *framing == Framing::Close
        || (has(header::TRANSFER_ENCODING.as_str()) && has(header::CONTENT_LENGTH.as_str()))
    {
        assert!(!keep_alive, "{framing:?} cannot keep the connection");
    }
}

fuzz_target!(|data: &[u8]| {
    for method in [Method::POST, Method::GET, Method::HEAD] {
        let mut first: Option<Outcome> = None;
        for lengths in split_patterns(data) {
            let o = feed(data, &lengths, &method);
            check_head(data, &method, &o);
            match &first {
                None => first = Some(o),
                Some(f) => assert_eq!(&o, f, "split {lengths:?} reads differently"),
            }
        }
    }
});
