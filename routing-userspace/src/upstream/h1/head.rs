//! HTTP/1.1 message heads, as the upstream side writes and reads them: encoding a request head
//! into a reused buffer, and parsing a response head (with `httparse`) into its status, its
//! framing and its end-to-end fields, kept as the bytes they came in ([`Fields`]). Pure
//! functions over bytes, so tests and fuzzers can drive them directly.
//!
//! A response's hop-by-hop headers (RFC 9110 section 7.6.1: `Connection`, the headers it
//! names, `Transfer-Encoding` and the rest of [`HOP_BY_HOP`]) describe the pod's connection,
//! not the answer: they are read for the framing and the keep-alive, and are not among the
//! fields relayed.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;

use super::fields::{Fields, Span};

/// Largest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most response header fields accepted.
const MAX_HEADERS: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("invalid response head: {0}")]
    Parse(String),
    #[error("response head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("invalid response header {0:?}")]
    BadHeader(String),
    #[error("invalid Content-Length {0:?}")]
    BadLength(String),
    #[error("the upstream switched protocols (101), which the proxy does not forward")]
    Upgrade,
}

/// How a response body is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304, or `Content-Length: 0`).
    Empty,
    Length(u64),
    Chunked,
    /// Until the connection closes.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    /// The end-to-end fields, to be relayed.
    pub fields: Fields,
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
}

/// How a request body is framed beyond what its headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// The headers say it (or there is no body).
    AsIs,
    /// Add `Content-Length: n`.
    Length(usize),
    /// Add `Transfer-Encoding: chunked` (a streamed body without a length).
    Chunked,
}

impl BodyFraming {
    pub fn of(add_length: Option<usize>, chunked: bool) -> Self {
        match (add_length, chunked) {
            (Some(n), _) => BodyFraming::Length(n),
            (None, true) => BodyFraming::Chunked,
            (None, false) => BodyFraming::AsIs,
        }
    }
}

/// Append a request head to `out`: its header map, then `lines` (header lines the caller
/// made, `name: value\r\n` each, written piece by piece), then the framing header. Hop-by-hop
/// headers were removed by the caller.
pub fn encode_request(
    out: &mut Vec<u8>,
    head: &http::request::Parts,
    lines: &[&[u8]],
    framing: BodyFraming,
) {
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        head.uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for piece in lines {
        out.extend_from_slice(piece);
    }
    match framing {
        BodyFraming::AsIs => {}
        BodyFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n as u64);
            out.extend_from_slice(b"\r\n");
        }
        BodyFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Append `n` in decimal (a Content-Length), without formatting machinery or an allocation.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// A `Content-Length` value (RFC 9110 section 8.6): one or more ASCII digits, leading zeros
/// allowed, nothing else (no sign, no space, no list), no larger than `u64`. The proxy's one
/// reader of a length: for a client's request, a pod's response and the proxy's own answers,
/// so no two of them can read one value two ways.
pub fn decimal_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

fn content_length(fields: &Fields) -> Result<Option<u64>, HeadError> {
    let mut found: Option<u64> = None;
    for v in fields.get_all(header::CONTENT_LENGTH.as_str()) {
        // `42, 42` and repeated equal fields are one length; anything else is an error.
        for part in v.split(|&b| b == b',') {
            let bad = || HeadError::BadLength(String::from_utf8_lossy(v).into_owned());
            let n = decimal_length(part.trim_ascii()).ok_or_else(bad)?;
            if found.is_some_and(|f| f != n) {
                return Err(bad());
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// Parse a response head from the front of `buf`. `Ok(None)`: incomplete, read more. On
/// success the head's bytes are split off `buf` (what follows is the body); interim 1xx
/// responses other than 101 are skipped.
pub fn parse_response(
    buf: &mut BytesMut,
    request: &Method,
) -> Result<Option<ResponseHead>, HeadError> {
    loop {
        let Some((status, version, fields, hop)) = parse_one(buf)? else {
            return Ok(None);
        };
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(HeadError::Upgrade);
        }
        if status.is_informational() {
            continue;
        }
        let framing = framing(&fields, &hop, status, request)?;
        let keep_alive = keep_alive(&fields, &hop, version, framing);
        return Ok(Some(ResponseHead {
            status,
            fields,
            framing,
            keep_alive,
        }));
    }
}

/// One response head (final or interim) split off the front of `buf`: its status, version,
/// end-to-end fields (sharing the head's memory) and what its hop-by-hop fields said.
/// `Ok(None)`: incomplete.
type Parsed = (StatusCode, Version, Fields, HopByHop);

fn parse_one(buf: &mut BytesMut) -> Result<Option<Parsed>, HeadError> {
    let mut lines = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut r, buf, &mut lines);
    let n = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Parse(e.to_string())),
    };
    if n > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let code = r.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| HeadError::Parse(format!("status {code}")))?;
    let version = match r.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // httparse accepted each name and value only if `HeaderName` and `HeaderValue` would
    // (`httparse_checks_fields_as_http_does`), so the fields need no second look.
    let base = buf.as_ptr() as usize;
    // n <= MAX_HEAD, so every offset and length fits.
    let at = |s: &[u8]| ((s.as_ptr() as usize - base) as u32, s.len() as u32);
    let mut spans = SmallVec::new();
    let mut hop = HopByHop::default();
    let mut names_others = false;
    for h in r.headers.iter() {
        let name = h.name.as_bytes();
        match hop_by_hop(name) {
            None => spans.push(Span {
                name: at(name),
                value: at(h.value),
            }),
            Some(CONNECTION_AT) => {
                for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    hop.close |= token.eq_ignore_ascii_case(b"close");
                    hop.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                    names_others |= names_end_to_end(token);
                }
            }
            Some(TRANSFER_ENCODING_AT) => {
                let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default();
                hop.transfer_encoding = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
            Some(_) => {}
        }
    }
    let named_by_connection = |name: &[u8]| {
        r.headers
            .iter()
            .filter(|h| hop_by_hop(h.name.as_bytes()) == Some(CONNECTION_AT))
            .flat_map(|h| h.value.split(|&b| b == b','))
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(name))
    };
    if names_others {
        // `Connection: x-private`: x-private described this connection only.
        spans.retain(|s: &mut Span| {
            let (start, len) = s.name;
            !named_by_connection(&buf[start as usize..][..len as usize])
        });
    }
    let head: Bytes = buf.split_to(n).freeze();
    Ok(Some((status, version, Fields::new(head, spans), hop)))
}

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1, and the
/// legacy `Proxy-Connection` and `Proxy-Authorization`): the proxy's one list, for the
/// client's request (`proxy::headers`) and a pod's response (here).
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];
/// Where `Connection` and `Transfer-Encoding` are in [`HOP_BY_HOP`].
const CONNECTION_AT: usize = 0;
const TRANSFER_ENCODING_AT: usize = 5;

/// Where `name` (any case) is in [`HOP_BY_HOP`], if it is a hop-by-hop header. Most names are
/// not, and their length says so without comparing.
pub fn hop_by_hop(name: &[u8]) -> Option<usize> {
    // te 2, trailer and upgrade 7, connection and keep-alive 10, proxy-connection 16,
    // transfer-encoding 17, proxy-authorization 19.
    if !matches!(name.len(), 2 | 7 | 10 | 16 | 17 | 19) {
        return None;
    }
    HOP_BY_HOP
        .iter()
        .position(|h| h.len() == name.len() && name.eq_ignore_ascii_case(h.as_bytes()))
}

/// What a response head's hop-by-hop headers said.
#[derive(Debug, Default)]
struct HopByHop {
    /// The last `Transfer-Encoding` line, if there was one: whether its last coding is
    /// `chunked`.
    transfer_encoding: Option<bool>,
    /// `Connection` lists `close` / `keep-alive`.
    close: bool,
    keep_alive: bool,
}

/// A `Connection` token (trimmed) that names an end-to-end header, which then goes too
/// (`close` counts as one, so a header of that name goes): for a pod's response here and the
/// client's request (`proxy::headers`).
pub fn names_end_to_end(token: &[u8]) -> bool {
    !token.is_empty() && hop_by_hop(token).is_none()
}

/// How the body of a response to `request` is delimited (RFC 9112 section 6.3).
fn framing(
    fields: &Fields,
    hop: &HopByHop,
    status: StatusCode,
    request: &Method,
) -> Result<Framing, HeadError> {
    if *request == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if let Some(chunked) = hop.transfer_encoding {
        return Ok(if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        });
    }
    Ok(match content_length(fields)? {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::Close,
    })
}

/// Whether the connection may carry another request: HTTP/1.1 unless `Connection: close`,
/// HTTP/1.0 only with `keep-alive`; never after a body delimited by the close, or one framed
/// by both `Transfer-Encoding` and `Content-Length`.
fn keep_alive(fields: &Fields, hop: &HopByHop, version: Version, framing: Framing) -> bool {
    let asked = match version {
        Version::HTTP_10 => !hop.close && hop.keep_alive,
        _ => !hop.close,
    };
    asked
        && framing != Framing::Close
        && !(hop.transfer_encoding.is_some()
            && fields.get(header::CONTENT_LENGTH.as_str()).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderMap, HeaderName, HeaderValue};

    fn parse(text: &str) -> Result<Option<(ResponseHead, Vec<u8>)>, HeadError> {
        let mut buf = BytesMut::from(text.as_bytes());
        Ok(parse_response(&mut buf, &Method::POST)?.map(|h| (h, buf.to_vec())))
    }

    /// A length written in decimal reads back as itself, and is what formatting writes.
    #[test]
    fn a_decimal_length_reads_back_as_written() {
        for n in [0, 1, 9, 10, 99, 100, 4096, 1 << 40, u64::MAX - 1, u64::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(&out[1..], n.to_string().as_bytes());
            assert_eq!(decimal_length(&out[1..]), Some(n));
        }
    }

    #[test]
    fn frames_as_rfc_9112_says() {
        let (h, rest) = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.framing, h.keep_alive),
            (StatusCode::OK, Framing::Length(5), true)
        );
        assert_eq!(h.fields.get("x-a"), Some(&b"b"[..]));
        assert_eq!(rest, b"hello");
        let (h, _) = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        let (h, _) = parse("HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let (h, _) = parse("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        let (h, _) = parse("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = parse("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes unless it says keep-alive");
        let (h, _) =
            parse("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx")
                .unwrap()
                .unwrap();
        assert!(h.keep_alive);
        let (h, _) = parse("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(3));
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"[..]);
        let h = parse_response(&mut buf, &Method::HEAD).unwrap().unwrap();
        assert_eq!(h.framing, Framing::Empty, "a HEAD response has no body");
    }

    #[test]
    fn skips_interim_responses_and_waits_for_more() {
        let (h, rest) =
            parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!((h.status, h.framing), (StatusCode::CREATED, Framing::Empty));
        assert!(rest.is_empty());
        assert!(parse("HTTP/1.1 200 OK\r\nContent-Le").unwrap().is_none());
    }

    #[test]
    fn a_length_is_digits_only() {
        for (text, want) in [
            ("0", Some(0)),
            ("42", Some(42)),
            ("0042", Some(42)),
            ("18446744073709551615", Some(u64::MAX)),
            ("000000000000000000000000007", Some(7)),
            ("18446744073709551616", None),
            ("", None),
            ("+5", None),
            ("-1", None),
            ("4 2", None),
            (" 42", None),
            ("42,42", None),
            ("0x10", None),
        ] {
            assert_eq!(decimal_length(text.as_bytes()), want, "{text:?}");
        }
    }

    /// A head as read: its framing, keep-alive and end-to-end headers (sorted).
    type Read = (Framing, bool, Vec<(String, String)>);

    /// The reading before hop-by-hop headers were left out of the map: every header in the
    /// map, framing and keep-alive read from it, then the proxy's strip.
    fn read_with_every_header_in_the_map(text: &str, request: &Method) -> Result<Read, ()> {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut fields);
        r.parse(text.as_bytes()).map_err(|_| ())?;
        let mut h = HeaderMap::new();
        for f in r.headers.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| ())?;
            h.append(name, HeaderValue::from_bytes(f.value).map_err(|_| ())?);
        }
        let lists = |v: &HeaderValue, token: &str| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        };
        let status = StatusCode::from_u16(r.code.unwrap()).unwrap();
        let te = h.get_all(header::TRANSFER_ENCODING).iter().next_back();
        let framing = if *request == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            Framing::Empty
        } else if let Some(v) = te {
            let last = v.as_bytes().rsplit(|&b| b == b',').next().unwrap();
            match last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                true => Framing::Chunked,
                false => Framing::Close,
            }
        } else {
            // The length as the map would give it: every value, all equal.
            let mut length = None;
            for v in h.get_all(header::CONTENT_LENGTH) {
                for part in v.as_bytes().split(|&b| b == b',') {
                    let n = decimal_length(part.trim_ascii()).ok_or(())?;
                    if length.is_some_and(|l| l != n) {
                        return Err(());
                    }
                    length = Some(n);
                }
            }
            match length {
                Some(0) => Framing::Empty,
                Some(n) => Framing::Length(n),
                None => Framing::Close,
            }
        };
        let connection = h.get_all(header::CONNECTION);
        let close = connection.iter().any(|v| lists(v, "close"));
        let asked = match r.version {
            Some(0) => !close && connection.iter().any(|v| lists(v, "keep-alive")),
            _ => !close,
        };
        let keep_alive = asked
            && framing != Framing::Close
            && !(te.is_some() && h.contains_key(header::CONTENT_LENGTH));
        crate::proxy::headers::strip_hop_by_hop(&mut h);
        Ok((framing, keep_alive, sorted(&h)))
    }

    fn sorted_fields(f: &Fields) -> Vec<(String, String)> {
        let mut v: Vec<_> = f
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).to_ascii_lowercase(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn sorted(h: &HeaderMap) -> Vec<(String, String)> {
        let mut v: Vec<_> = h
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Heads of every mix of framing, connection and hop-by-hop lines read as before: the same
    /// framing, keep-alive and end-to-end headers, and refused alike.
    #[test]
    fn hop_by_hop_headers_read_without_the_map_as_with_it() {
        let lines = [
            "Content-Length: 5",
            "Content-Length: 5, 5",
            "Content-Length: 7",
            "Content-Length: x",
            "Content-Length: 0",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: gzip, chunked",
            "transfer-encoding: chunked, gzip",
            "Transfer-Encoding: identity",
            "Connection: close",
            "Connection: keep-alive",
            "connection: Keep-Alive, x-priv",
            "Connection: x-priv,  CLOSE ",
            "Connection: ",
            "Connection: te, upgrade",
            "Keep-Alive: timeout=5",
            "X-Priv: 1",
            "Close: yes",
            "TE: trailers",
            "Trailer: x-sum",
            "Upgrade: h2c",
            "Proxy-Connection: keep-alive",
            "Proxy-Authorization: Basic x",
            "X-A: b",
            "Content-Type: text/plain",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        let mut read = 0;
        for round in 0..4000 {
            let version = ["HTTP/1.0", "HTTP/1.1"][next(2)];
            let status = ["200 OK", "204 No Content", "304 Not Modified", "500 Oops"][next(4)];
            let method = [Method::GET, Method::HEAD][usize::from(next(8) == 0)].clone();
            let mut text = format!("{version} {status}\r\n");
            for _ in 0..next(6) {
                text.push_str(lines[next(lines.len())]);
                text.push_str("\r\n");
            }
            text.push_str("\r\n");
            let mut buf = BytesMut::from(text.as_bytes());
            let now = parse_response(&mut buf, &method)
                .map(|h| h.map(|h| (h.framing, h.keep_alive, sorted_fields(&h.fields))));
            let before = read_with_every_header_in_the_map(&text, &method);
            match (now, before) {
                (Ok(Some(now)), Ok(before)) => {
                    assert_eq!(now, before, "round {round}:\n{text}");
                    read += 1;
                }
                (Err(_), Err(())) => {}
                (now, before) => panic!("round {round}: {now:?} against {before:?}:\n{text}"),
            }
        }
        assert!(read > 3000, "most heads are readable: {read}");
    }

    /// The fields are relayed unchecked after httparse: it must refuse every name byte that
    /// `HeaderName` refuses and every value byte that `HeaderValue` refuses, and accept the
    /// rest (or a pod's field would be refused, or relayed when it should not be).
    #[test]
    fn httparse_checks_fields_as_http_does() {
        for b in 0..=255u8 {
            let head = |name: &[u8], value: &[u8]| {
                let mut text = b"HTTP/1.1 200 OK\r\n".to_vec();
                text.extend_from_slice(name);
                text.extend_from_slice(b": ");
                text.extend_from_slice(value);
                text.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
                parse_response(&mut BytesMut::from(&text[..]), &Method::GET)
            };
            let value = [b'a', b, b'z'];
            let read = head(b"X-V", &value);
            assert_eq!(
                read.is_ok(),
                HeaderValue::from_bytes(&value).is_ok(),
                "value byte {b:#x}"
            );
            if let Ok(Some(h)) = read {
                assert_eq!(h.fields.get("x-v"), Some(&value[..]), "value byte {b:#x}");
            }
            if b == b':' {
                // The name ends there: another name, not another byte in this one.
                continue;
            }
            let name = [b'x', b, b'y'];
            assert_eq!(
                head(&name, b"v").is_ok(),
                HeaderName::from_bytes(&name).is_ok(),
                "name byte {b:#x}"
            );
        }
    }

    #[test]
    fn the_hop_by_hop_names_are_the_proxys() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "proxy-authorization",
        ] {
            assert!(hop_by_hop(name.as_bytes()).is_some(), "{name}");
            assert!(
                hop_by_hop(name.to_uppercase().as_bytes()).is_some(),
                "{name}"
            );
            let mut h = HeaderMap::new();
            h.insert(HeaderName::from_static(name), HeaderValue::from_static("x"));
            crate::proxy::headers::strip_hop_by_hop(&mut h);
            assert!(h.is_empty(), "{name}");
        }
        for name in [
            "content-length",
            "tee",
            "connections",
            "x-keep-alive",
            "trailers",
            "close",
        ] {
            assert_eq!(hop_by_hop(name.as_bytes()), None, "{name}");
        }
        assert_eq!(HOP_BY_HOP[CONNECTION_AT], header::CONNECTION.as_str());
        assert_eq!(
            HOP_BY_HOP[TRANSFER_ENCODING_AT],
            header::TRANSFER_ENCODING.as_str()
        );
    }

    #[test]
    fn rejects_what_cannot_be_framed() {
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n"),
            Err(HeadError::BadLength(_))
        ));
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
            Err(HeadError::BadLength(_))
        ));
        assert!(matches!(
            parse("HTTP/1.1 101 Switching\r\n\r\n"),
            Err(HeadError::Upgrade)
        ));
        assert!(matches!(
            parse("NOT HTTP\r\n\r\n"),
            Err(HeadError::Parse(_))
        ));
        let huge = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(parse(&huge).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn every_header_is_kept_on_either_side_of_the_inline_fields_and_too_many_fail() {
        for count in [1, 7, 8, 9, 33, MAX_HEADERS - 1] {
            let fields: String = (0..count).map(|i| format!("X-H{i}: v{i}\r\n")).collect();
            let text = format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\nok");
            let (h, rest) = parse(&text).unwrap().unwrap();
            assert_eq!(h.fields.len(), count + 1, "{count} headers");
            assert_eq!(
                h.fields.get(format!("x-h{}", count - 1).as_str()),
                Some(format!("v{}", count - 1).as_bytes())
            );
            assert_eq!(
                (h.framing, rest.as_slice()),
                (Framing::Length(2), &b"ok"[..])
            );
        }
        let fields: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect();
        let text = format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
        assert_eq!(parse(&text).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn encodes_origin_form_requests() {
        let (mut head, ()) = http::Request::post("/v1/chat/completions?x=1")
            .header("host", "10.0.0.1:8000")
            .header("content-length", "2")
            .body(())
            .unwrap()
            .into_parts();
        let mut out = Vec::new();
        encode_request(&mut out, &head, &[], BodyFraming::AsIs);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\ncontent-length: 2\r\n\r\n"
        );
        head.headers.remove("content-length");
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &head,
            &[b"via: ", b"1.1 x\r\n"],
            BodyFraming::Length(5),
        );
        assert!(String::from_utf8(out)
            .unwrap()
            .ends_with("\r\nvia: 1.1 x\r\ncontent-length: 5\r\n\r\n"));
    }
}
