//! Hop-by-hop header handling (RFC 9110 section 7.6.1) and forwarding headers.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, not the message.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

/// Remove hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Append the client to `X-Forwarded-For` and say we passed by (`Via`).
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client_ip: std::net::IpAddr,
    original_host: Option<HeaderValue>,
) {
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {client_ip}"),
        None => client_ip.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    if let Some(host) = original_host {
        headers.entry("x-forwarded-host").or_insert(host);
    }
    headers
        .entry("x-forwarded-proto")
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
    fn forwarding_appends() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        add_forwarding(
            &mut h,
            "127.0.0.1".parse().unwrap(),
            Some(HeaderValue::from_static("proxy:8080")),
        );
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 127.0.0.1");
        assert_eq!(h["x-forwarded-host"], "proxy:8080");
        assert_eq!(h["via"], "1.1 flexinfer-proxy");
    }
}
