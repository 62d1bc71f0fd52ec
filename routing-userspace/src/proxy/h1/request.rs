//! A client's request head: httparse reads the syntax, then the rules below decide where the
//! body ends and whether the connection lives on.
//!
//! Where two readings of the same bytes are possible, the head is refused (400) rather than
//! read one way: a proxy that frames a body differently from the server behind it or the
//! proxy in front of it lets a client smuggle a second request inside the first. So a request
//! with both `Content-Length` and `Transfer-Encoding`, with differing lengths or a list of them
//! in one line, with a coding after `chunked` (or `chunked` twice), with `Transfer-Encoding` in
//! HTTP/1.0, with a line ended by a bare LF, with a folded header line (obs-fold) or with two
//! `Host` headers is refused. hyper accepts the bare LF, the CL+TE pair (taking TE) and two
//! hosts; the fuzz target `h1_request` holds us to hyper's reading of everything both accept,
//! and to refusing only what these rules name.

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};

use crate::proxy::prepare::ADDED_HEADERS;
use crate::proxy::relayed::Relayed;
use crate::upstream::h1::head::{decimal_length, names_end_to_end};
use crate::vocab::API_PATHS;

/// Most header lines in a request head (more: 431, as hyper's default).
pub const MAX_HEADERS: usize = 100;

/// How the request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (neither header, or `Content-Length: 0`).
    Empty,
    /// `Content-Length: n`, n > 0.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed head and what the connection needs from it.
#[derive(Debug)]
pub struct Head {
    /// The head, with the fields the proxy reads (`proxy::relayed::READ`) in its map.
    pub parts: http::request::Parts,
    /// The other fields, relayed to the pod as their lines.
    pub relayed: Relayed,
    pub framing: Framing,
    /// The client lets the connection carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before its body.
    pub expect_continue: bool,
}

/// Why a head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed request head ({0})")]
    Syntax(&'static str),
    #[error("request head has more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
    #[error("a line of the request head ends with a bare LF, not CRLF")]
    BareLf,
    #[error("request has both Content-Length and Transfer-Encoding")]
    LengthAndTransferEncoding,
    #[error("invalid Content-Length")]
    BadContentLength,
    #[error("Content-Length values differ")]
    ConflictingContentLength,
    #[error("Transfer-Encoding does not end with chunked")]
    ChunkedNotLast,
    #[error("Transfer-Encoding names chunked more than once")]
    ChunkedTwice,
    #[error("unsupported Transfer-Encoding (only chunked is accepted)")]
    UnsupportedTransferEncoding,
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    TransferEncodingInHttp10,
    #[error("more than one Host header")]
    DuplicateHost,
    #[error("invalid request target")]
    BadTarget,
}

impl HeadError {
    pub fn status(self) -> StatusCode {
        match self {
            HeadError::TooManyHeaders => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::UnsupportedTransferEncoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Parse the head at the front of `buf`: `Ok(None)` while it is incomplete, else the head,
/// split off `buf`. The target (unless it is one of the API's paths, kept parsed) and the
/// header values point into the head's bytes instead of being copied; the fields the proxy does
/// not read are not in the map but relayed as their lines ([`Relayed`]).
pub fn parse(buf: &mut BytesMut) -> Result<Option<Head>, HeadError> {
    // Left uninitialized: httparse writes the slots it fills (100 empty headers set up front
    // cost about 500 instructions a request).
    let mut slots =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(e) => return Err(HeadError::Syntax(syntax_name(e))),
    };
    if has_bare_lf(&buf[..len]) {
        return Err(HeadError::BareLf);
    }
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Syntax("method"))?;
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let from = s.as_ptr() as usize - base;
        from..from + s.len()
    };
    let target = span(req.path.unwrap_or_default().as_bytes());
    let count = req.headers.len();
    // Where each name and value lies in the head, to slice them out of it once it is split off.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let mut rules = Rules::default();
    for (h, at) in req.headers.iter().zip(spans.iter_mut()) {
        rules.note(h.name.as_bytes(), h.value)?;
        let (name, value) = (span(h.name.as_bytes()), span(h.value));
        *at = (
            name.start as u32,
            name.end as u32,
            value.start as u32,
            value.end as u32,
        );
    }
    let framing = rules.framing(version)?;
    let keep_alive = rules.keep_alive(version);
    let expect_continue = version == Version::HTTP_11 && rules.expect_continue;

    let head = buf.split_to(len).freeze();
    let uri = target_uri(&head, target)?;
    let spans = &spans[..count];
    let (headers, relayed) = match fields(&head, spans, rules.connection_names_others)? {
        Some(split) => split,
        // More runs of relayed lines than are kept: all in the map, so that the fields of one
        // name stay in their order.
        None => fields(&head, spans, true)?.expect("nothing is relayed"),
    };
    let mut parts = Request::new(()).into_parts().0;
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(Head {
        parts,
        relayed,
        framing,
        keep_alive,
        expect_continue,
    }))
}

/// The fields at `spans` (name and value ranges) of `head`: those the proxy reads in a map,
/// the others relayed as their lines (all in the map with `all_in_map`). `None` when the
/// relayed lines would need more runs than are kept.
fn fields(
    head: &bytes::Bytes,
    spans: &[(u32, u32, u32, u32)],
    all_in_map: bool,
) -> Result<Option<(HeaderMap, Relayed)>, HeadError> {
    // Room for what the proxy adds before forwarding, so the map is built once.
    let mut headers = HeaderMap::with_capacity(spans.len() + ADDED_HEADERS);
    let mut relayed = Relayed::default();
    let mut has_length = false;
    let bad_name = |_| HeadError::Syntax("header name");
    for (i, &(n0, n1, v0, v1)) in spans.iter().enumerate() {
        let raw = &head[n0 as usize..n1 as usize];
        let read = match all_in_map {
            true => Some(super::names::name(raw).map_err(bad_name)?),
            false => super::names::read_name(raw).map_err(bad_name)?,
        };
        let Some(name) = read else {
            // A line ends where the next begins (no folded line, no bare LF got here), the
            // last one at the blank line.
            let end = spans
                .get(i + 1)
                .map_or(head.len() as u32 - 2, |next| next.0);
            if !relayed.push(head, n0, end) {
                return Ok(None);
            }
            continue;
        };
        if name == header::CONTENT_LENGTH && std::mem::replace(&mut has_length, true) {
            // A repeated equal length (a different one was refused above) is kept once, so
            // the pod is not sent two.
            continue;
        }
        let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize))
            .map_err(|_| HeadError::Syntax("header value"))?;
        headers.append(name, value);
    }
    Ok(Some((headers, relayed)))
}

fn syntax_name(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "header name",
        httparse::Error::HeaderValue => "header value",
        httparse::Error::NewLine => "line ending",
        httparse::Error::Status => "status",
        httparse::Error::Token => "method or token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "version",
    }
}

/// Whether a line of `head` ends with LF alone (httparse accepts it; a server behind us or a
/// proxy in front may not, so the two would see different heads).
pub(super) fn has_bare_lf(head: &[u8]) -> bool {
    if head.first() == Some(&b'\n') {
        return true;
    }
    // Every byte against the one before it, without an early exit, so the loop vectorizes: a
    // search per line cost more on a head of a few short lines.
    let mut bare = false;
    for (&b, &before) in head.get(1..).unwrap_or_default().iter().zip(head) {
        bare |= (b == b'\n') & (before != b'\r');
    }
    bare
}

/// The OpenAI API's paths, each parsed once.
static API_URIS: std::sync::LazyLock<[Uri; API_PATHS.len()]> =
    std::sync::LazyLock::new(|| API_PATHS.map(Uri::from_static));

/// The request target at `at` in `head`: one of the API's paths is a clone of its `Uri`
/// parsed once (its bytes static, so the clone counts nothing), any other target is parsed.
fn target_uri(head: &bytes::Bytes, at: std::ops::Range<usize>) -> Result<Uri, HeadError> {
    let target = &head[at.clone()];
    if let Some(known) = API_URIS.iter().find(|u| u.path().as_bytes() == target) {
        return Ok(known.clone());
    }
    Uri::from_maybe_shared(head.slice(at)).map_err(|_| HeadError::BadTarget)
}

/// What the framing and connection headers said, collected over the header lines.
#[derive(Debug, Default)]
struct Rules {
    length: Option<u64>,
    /// A Content-Length line that was no length, or differed from another (reported after
    /// Transfer-Encoding is known: with it, the pair is the reason).
    length_error: Option<HeadError>,
    transfer_encoding: bool,
    chunked_last: bool,
    chunked_count: u32,
    other_coding: bool,
    hosts: u32,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    /// A `Connection` header names a field besides the hop-by-hop ones (`close` counts).
    connection_names_others: bool,
}

impl Rules {
    fn note(&mut self, name: &[u8], value: &[u8]) -> Result<(), HeadError> {
        // Names as bytes: a length that differs settles most comparisons at once.
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        if is(b"content-length") {
            // One number per line (a list is refused, as hyper refuses it); equal lines are one
            // length.
            match (length(value), self.length) {
                (Err(e), _) => self.length_error = self.length_error.or(Some(e)),
                (Ok(n), Some(m)) if m != n => {
                    self.length_error = self
                        .length_error
                        .or(Some(HeadError::ConflictingContentLength))
                }
                (Ok(n), _) => self.length = Some(n),
            }
        } else if is(b"transfer-encoding") {
            self.transfer_encoding = true;
            for item in value.split(|&b| b == b',') {
                let coding = item.trim_ascii();
                if coding.is_empty() {
                    // `chunked,` does not end with chunked (hyper reads it so too).
                    self.chunked_last = false;
                    continue;
                }
                if coding.eq_ignore_ascii_case(b"chunked") {
                    self.chunked_count += 1;
                    self.chunked_last = true;
                } else {
                    self.other_coding = true;
                    self.chunked_last = false;
                }
            }
        } else if is(b"host") {
            self.hosts += 1;
            if self.hosts > 1 {
                return Err(HeadError::DuplicateHost);
            }
        } else if is(b"connection") {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
                self.connection_names_others |= names_end_to_end(token);
            }
        } else if is(b"expect") {
            self.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
        Ok(())
    }

    fn framing(&self, version: Version) -> Result<Framing, HeadError> {
        if self.transfer_encoding {
            if version == Version::HTTP_10 {
                return Err(HeadError::TransferEncodingInHttp10);
            }
            if self.length.is_some() || self.length_error.is_some() {
                return Err(HeadError::LengthAndTransferEncoding);
            }
            if !self.chunked_last {
                return Err(HeadError::ChunkedNotLast);
            }
            if self.chunked_count > 1 {
                return Err(HeadError::ChunkedTwice);
            }
            if self.other_coding {
                return Err(HeadError::UnsupportedTransferEncoding);
            }
            return Ok(Framing::Chunked);
        }
        if let Some(e) = self.length_error {
            return Err(e);
        }
        Ok(match self.length {
            None | Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
        })
    }

    fn keep_alive(&self, version: Version) -> bool {
        match version {
            Version::HTTP_10 => self.keep_alive && !self.close,
            _ => !self.close,
        }
    }
}

/// One Content-Length line's value (white space around it allowed).
fn length(value: &[u8]) -> Result<u64, HeadError> {
    decimal_length(value.trim_ascii()).ok_or(HeadError::BadContentLength)
}
