//! Hop-by-hop header handling (RFC 9110 section 7.6.1) and forwarding headers.
//!
//! Names are constants (parsed once, at compile time) and the hop-by-hop set is found in one
//! pass over the headers: this runs twice per request, on the request and on the response.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Headers that describe one connection, not the message.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Where `name` is in [`HOP_BY_HOP`]. Most headers are not, and their name's length says so
/// without comparing names.
#[inline]
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    // te 2, trailer and upgrade 7, connection and keep-alive 10, proxy-connection 16,
    // transfer-encoding 17, proxy-authorization 19.
    if !matches!(name.as_str().len(), 2 | 7 | 10 | 16 | 17 | 19) {
        return None;
    }
    HOP_BY_HOP.iter().position(|h| h == name)
}

/// Remove hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut found = [false; 8];
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            found[i] = true;
        }
    }
    if found[0] && names_other_headers(headers) {
        // `Connection: keep-alive` and the like name only headers removed anyway (checked
        // without parsing a name); anything else it names goes too.
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .filter(|n| !HOP_BY_HOP.contains(n))
            .collect();
        for name in listed {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if found[i] {
            headers.remove(name);
        }
    }
}

/// Whether a `Connection` header lists a name outside the hop-by-hop set.
fn names_other_headers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|t| {
            !t.is_empty()
                && !HOP_BY_HOP
                    .iter()
                    .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(t))
        })
}

/// The `X-Forwarded-For` value of a client (made once per client connection).
pub fn client_ip_header(ip: std::net::IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is a valid header value")
}

/// Append the client to `X-Forwarded-For` and say we passed by (`Via`).
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client_ip: &HeaderValue,
    original_host: Option<HeaderValue>,
) {
    let xff = match headers.get(X_FORWARDED_FOR) {
        Some(prev) => {
            let mut v = Vec::with_capacity(prev.len() + 2 + client_ip.len());
            v.extend_from_slice(prev.as_bytes());
            v.extend_from_slice(b", ");
            v.extend_from_slice(client_ip.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        }
        None => Some(client_ip.clone()),
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if let Some(host) = original_host {
        headers.entry(X_FORWARDED_HOST).or_insert(host);
    }
    headers
        .entry(X_FORWARDED_PROTO)
        .or_insert(HeaderValue::from_static("http"));
    headers.append(header::VIA, HeaderValue::from_static("1.1 flexinfer-proxy"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_hop_by_hop_and_connection_listed_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("x-session-id", HeaderValue::from_static("s"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "x-session-id"]);
    }

    #[test]
    fn a_connection_header_naming_only_hop_by_hop_headers_removes_just_those() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Keep-Alive, ,TE"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["content-type"]);
        // `close` is an option, and a header of that name goes too.
        let mut h = HeaderMap::new();
        h.append("connection", HeaderValue::from_static("keep-alive"));
        h.append("connection", HeaderValue::from_static("close, X-Trace"));
        h.insert("close", HeaderValue::from_static("1"));
        h.insert("x-trace", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-kept"]);
    }

    #[test]
    fn the_length_filter_lets_every_hop_by_hop_name_through() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
        for other in [
            "host",
            "content-length",
            "x-session-id",
            "user-agent",
            "tee",
        ] {
            assert_eq!(hop_by_hop_index(&HeaderName::from_static(other)), None);
        }
    }

    #[test]
    fn forwarding_appends() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        add_forwarding(
            &mut h,
            &client_ip_header("127.0.0.1".parse().unwrap()),
            Some(HeaderValue::from_static("proxy:8080")),
        );
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 127.0.0.1");
        assert_eq!(h["x-forwarded-host"], "proxy:8080");
        assert_eq!(h["via"], "1.1 flexinfer-proxy");
    }
}
