//! Phase 4, prepare the upstream request: its head is the client's head moved over (never
//! copied) with hop-by-hop headers removed, forwarding headers added, an origin-form URI and
//! the body's length; its body is the client's, rewritten only for `servedModelName`. The
//! `Host` header and the Service's base path are set per attempt, by the forward phase.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Method, Uri, Version};

use super::headers;
use super::read_body::ClientBody;
use super::relayed::Relayed;
use crate::body::{rewrite_model, BodyFields};
use crate::upstream::UpBody;

/// The upstream body: the bytes read (with `model` rewritten when the model says so), or the
/// client's stream.
pub fn body(
    client: ClientBody,
    fields: Option<&BodyFields<'_>>,
    served: Option<&str>,
    limit: usize,
) -> UpBody {
    match client {
        ClientBody::Read(bytes) => {
            let bytes = match (served, fields) {
                (Some(name), Some(f)) => rewrite_model(&bytes, f, name)
                    .map(Bytes::from)
                    .unwrap_or(bytes),
                _ => bytes,
            };
            UpBody::bytes(bytes)
        }
        ClientBody::Streamed(incoming) => UpBody::stream(incoming, limit),
    }
}

/// The origin-form target to forward: the stripped path when a `/model/<name>/` prefix was
/// removed, else the client's path and query.
pub fn origin_uri(uri: &Uri, forward_path: Option<PathAndQuery>) -> Uri {
    let pq = match forward_path {
        Some(p) => p,
        None => match uri.path_and_query() {
            // Already origin-form: keep the client's URI as it is.
            Some(_) if uri.scheme().is_none() && uri.authority().is_none() => return uri.clone(),
            Some(pq) => pq.clone(),
            None => PathAndQuery::from_static("/"),
        },
    };
    Uri::from(pq)
}

/// Headers the proxy may add to a client's header map: `traceparent` and `Content-Length`
/// (the forwarding headers and `Host` are written as lines of their own, see
/// [`headers::AddedLines`]). The proxy's HTTP/1 reader makes its header map with this much
/// room to spare, so that adding them never grows (and rehashes) the map.
pub const ADDED_HEADERS: usize = 2;

/// The client's head made the upstream head, in place, and the lines written after it (the
/// proxy's own, then the client's `relayed` ones). `read_len` is the length of a body the proxy
/// read (`None` when it streams the client's body, whose own length header then stays).
pub fn head(
    parts: &mut Parts,
    relayed: Relayed,
    uri: Uri,
    client_ip: &HeaderValue,
    read_len: Option<usize>,
) -> headers::AddedLines {
    // The forward phase sets `Host` per attempt; the client's goes to `X-Forwarded-Host`.
    let original_host = parts.headers.remove(header::HOST).or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    headers::strip_hop_by_hop(&mut parts.headers);
    let added =
        headers::AddedLines::forwarding(&mut parts.headers, client_ip, original_host, relayed);
    if let Some(len) = read_len {
        let bodyless = len == 0
            && matches!(
                parts.method,
                Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
            );
        if bodyless {
            parts.headers.remove(header::CONTENT_LENGTH);
        } else {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
    }
    added
}
