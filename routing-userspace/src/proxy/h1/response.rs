//! A response head for the client, and the framing of its body.
//!
//! The proxy decides the framing itself, from what the response says of its length: a
//! `Content-Length` it carries, else the body's exact size, else chunked (HTTP/1.1) or the
//! connection's close (HTTP/1.0). A `Transfer-Encoding` of the handler's is never copied: the
//! framing written is the one the body is sent with.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, StatusCode, Version};
use http_body_util::{Either, Full};

use crate::upstream::h1::fields::Fields;
use crate::upstream::h1::head::{decimal_length, push_decimal};

/// A response body that may carry header fields of the head's own (a pod's, relayed as they
/// came: `upstream::h1::fields`), for the server to write after the head's map. An
/// `http::Response` has room for a map only, and making one of a pod's fields costs more than
/// relaying them.
pub trait CarriesFields {
    /// The fields, taken (the server writes them once).
    fn take_fields(&mut self) -> Option<Fields> {
        None
    }
}

impl CarriesFields for Full<Bytes> {}

impl<T: CarriesFields + ?Sized> CarriesFields for Box<T> {
    fn take_fields(&mut self) -> Option<Fields> {
        (**self).take_fields()
    }
}

impl<L: CarriesFields, R: CarriesFields> CarriesFields for Either<L, R> {
    fn take_fields(&mut self) -> Option<Fields> {
        match self {
            Either::Left(l) => l.take_fields(),
            Either::Right(r) => r.take_fields(),
        }
    }
}

/// How the response body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: a HEAD request, or a status that has none (1xx, 204, 304).
    None,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Delimited by closing the connection (an HTTP/1.0 client, length unknown).
    UntilClose,
}

/// What the request said that the response head depends on.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    pub head_method: bool,
    pub version: Version,
    /// The client would keep the connection, and the proxy is not closing it.
    pub keep_alive: bool,
}

impl Asked {
    pub fn of(method: &Method, version: Version, keep_alive: bool) -> Self {
        Self {
            head_method: method == Method::HEAD,
            version,
            keep_alive,
        }
    }
}

/// The head as written: how the body follows, and whether the connection lives on after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub framing: BodyFraming,
    pub keep_alive: bool,
}

/// Append the head of a response with `status`, `headers` and `relayed` (a pod's fields) to
/// `out`; `size` is the body's exact length when known.
pub fn write_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    relayed: Option<&Fields>,
    size: Option<u64>,
    asked: Asked,
) -> Written {
    let mut keep_alive = asked.keep_alive && !status.is_informational();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");

    let mut seen = Seen::default();
    for (name, value) in headers {
        if seen.passes(name.as_str().as_bytes(), value.as_bytes()) {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(relayed) = relayed {
        for (name, value, line) in relayed.lines() {
            if seen.passes(name, value) {
                out.extend_from_slice(line);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
    let Seen {
        length,
        date: has_date,
        close,
    } = seen;
    keep_alive &= !close;

    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        BodyFraming::None
    } else if let Some(n) = length {
        BodyFraming::Length(n)
    } else if let Some(n) = size {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, n);
        out.extend_from_slice(b"\r\n");
        BodyFraming::Length(n)
    } else if asked.version == Version::HTTP_11 {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        BodyFraming::Chunked
    } else {
        keep_alive = false;
        BodyFraming::UntilClose
    };
    if !has_date {
        out.extend_from_slice(b"date: ");
        with_date(|d| out.extend_from_slice(d));
        out.extend_from_slice(b"\r\n");
    }
    match (keep_alive, asked.version) {
        (false, _) => out.extend_from_slice(b"connection: close\r\n"),
        (true, Version::HTTP_10) => out.extend_from_slice(b"connection: keep-alive\r\n"),
        (true, _) => {}
    }
    out.extend_from_slice(b"\r\n");
    Written {
        framing: if asked.head_method {
            BodyFraming::None
        } else {
            framing
        },
        keep_alive,
    }
}

/// What the fields written so far said that the head's end depends on.
#[derive(Default)]
struct Seen {
    /// The first valid `Content-Length`.
    length: Option<u64>,
    date: bool,
    /// A `Connection` field said `close`.
    close: bool,
}

impl Seen {
    /// Note the field `name` (any case): whether it is written as it is, or the proxy writes
    /// what it says itself.
    fn passes(&mut self, name: &[u8], value: &[u8]) -> bool {
        let is = |h: &header::HeaderName| name.eq_ignore_ascii_case(h.as_str().as_bytes());
        // Most fields are none of these four, and their length says so.
        match name.len() {
            17 if is(&header::TRANSFER_ENCODING) => false,
            14 if is(&header::CONTENT_LENGTH) => match decimal_length(value.trim_ascii()) {
                Some(n) if self.length.is_none() => {
                    self.length = Some(n);
                    true
                }
                // A second or a broken one: the first valid length frames the body.
                _ => false,
            },
            // Written at the end, once, as the proxy decides.
            10 if is(&header::CONNECTION) => {
                self.close |= connection_says_close(value);
                false
            }
            4 if is(&header::DATE) => {
                self.date = true;
                true
            }
            _ => true,
        }
    }
}

fn connection_says_close(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// Append one chunk of `data` (not empty) in chunked framing.
pub fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = data.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk, with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The `100 Continue` interim response.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// The `Date` value of the current second (IMF-fixdate, 29 bytes), made once a second.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            }
        }
        f(&cached.1)
    })
}
