//! Hop-by-hop header handling (RFC 9110 section 7.6.1) and forwarding headers.
//!
//! Names are constants (parsed once, at compile time) and the hop-by-hop set is found in one
//! pass over the client's headers. A pod's response never carries its hop-by-hop headers this
//! far: they stay out of its header map as it is read (`upstream::h1::head`).
//!
//! What the proxy adds to a request (`Host`, the forwarding headers, the load-report request,
//! a sampled attempt's `traceparent`) is written by the upstream encoder as lines of its own
//! ([`AddedLines`]), not put in the header map: each insertion there hashes its name, about
//! 1,500 instructions a request for these. Only a client that sent one of the headers the
//! proxy extends or replaces has its map edited instead.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::relayed::{Relayed, RUNS};
use crate::signals::orca;
use crate::telemetry::propagation::{self, TRACEPARENT, TRACESTATE};
use crate::upstream::h1::head::{hop_by_hop, names_end_to_end, HOP_BY_HOP};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Where `name` is in [`HOP_BY_HOP`] (the one list, shared with the reading of a pod's
/// response).
#[inline]
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    hop_by_hop(name.as_str().as_bytes())
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
            .filter(|n| hop_by_hop_index(n).is_none())
            .collect();
        for name in listed {
            headers.remove(name);
        }
    }
    for (i, &name) in HOP_BY_HOP.iter().enumerate() {
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
        .any(names_end_to_end)
}

/// Header lines the upstream encoder writes after the map's: `Host` and a sampled attempt's
/// `traceparent` (per attempt), the forwarding headers and the load-report request when the
/// client's head does not carry a header of theirs (see the module doc), then the client's
/// fields relayed unread (`super::relayed`).
#[derive(Debug, Clone, Default)]
pub struct AddedLines {
    /// The client's address and original `Host`, when the map does not carry the forwarding
    /// headers: written as `X-Forwarded-For`, `X-Forwarded-Host`, `X-Forwarded-Proto` and `Via`.
    forwarding: Option<(HeaderValue, Option<HeaderValue>)>,
    /// Ask the pod for a load report (`endpoint-load-metrics-format`).
    load_report: bool,
    /// The client sent `endpoint-load-metrics-format`: asking replaces its value in the map.
    client_asked_load_report: bool,
    /// The attempt's `traceparent` (a sampled request).
    traceparent: Option<propagation::Encoded>,
    /// The client sent `traceparent` / `tracestate`.
    client_traceparent: bool,
    client_tracestate: bool,
    /// The client's fields the proxy does not read, written last as they came.
    relayed: Relayed,
}

/// The pieces of [`AddedLines::lines`], written one after the other: the proxy's lines, then
/// the runs of the client's relayed ones.
pub type Lines<'a> = [&'a [u8]; 14 + RUNS];

impl AddedLines {
    /// Add the forwarding headers to `headers` (the client's head, hop-by-hop headers gone):
    /// in the map when the client sent `X-Forwarded-For`, `-Host` or `-Proto` (the proxy
    /// extends or keeps them), else as lines.
    pub fn forwarding(
        headers: &mut HeaderMap,
        client_ip: &HeaderValue,
        original_host: Option<HeaderValue>,
        relayed: Relayed,
    ) -> Self {
        let (mut forwarded, mut asked, mut parent, mut state) = (false, false, false, false);
        for name in headers.keys() {
            // x-forwarded-for 15, -host 16, -proto 17; endpoint-load-metrics-format 28;
            // traceparent 11, tracestate 10.
            match name.as_str().len() {
                11 => parent |= name == TRACEPARENT,
                10 => state |= name == TRACESTATE,
                15..=17 => {
                    forwarded |= name == X_FORWARDED_FOR
                        || name == X_FORWARDED_HOST
                        || name == X_FORWARDED_PROTO
                }
                28 => asked |= name == orca::REQUEST_HEADER,
                _ => {}
            }
        }
        let forwarding = match forwarded {
            true => {
                headers.reserve(4);
                add_forwarding(headers, client_ip, original_host);
                None
            }
            false => Some((client_ip.clone(), original_host)),
        };
        Self {
            forwarding,
            load_report: false,
            client_asked_load_report: asked,
            traceparent: None,
            client_traceparent: parent,
            client_tracestate: state,
            relayed,
        }
    }

    /// A sampled request: the client's `traceparent` leaves the map (each attempt sends the
    /// proxy's, [`Self::set_traceparent`]), and so does its `tracestate` unless `keep_state`
    /// (see [`crate::telemetry::Trace::keeps_tracestate`]).
    pub fn traced(&mut self, headers: &mut HeaderMap, keep_state: bool) {
        if self.client_traceparent {
            headers.remove(TRACEPARENT);
        }
        if self.client_tracestate && !keep_state {
            headers.remove(TRACESTATE);
        }
    }

    /// The `traceparent` of the attempt about to go out (`None`: not sampled).
    pub fn set_traceparent(&mut self, value: Option<propagation::Encoded>) {
        self.traceparent = value;
    }

    /// Ask the pod for a load report with the request.
    pub fn ask_load_report(&mut self, headers: &mut HeaderMap) {
        match self.client_asked_load_report {
            true => {
                headers.insert(orca::REQUEST_HEADER, orca::REQUEST_VALUE);
            }
            false => self.load_report = true,
        }
    }

    /// The lines, with `host` as the `Host` header: pieces to write one after the other (empty
    /// ones for lines not written).
    pub fn lines<'a>(&'a self, host: &'a HeaderValue) -> Lines<'a> {
        let mut l: Lines<'a> = [b""; 14 + RUNS];
        (l[0], l[1], l[2]) = (b"host: ", host.as_bytes(), b"\r\n");
        if let Some((client_ip, original_host)) = &self.forwarding {
            (l[3], l[4], l[5]) = (b"x-forwarded-for: ", client_ip.as_bytes(), b"\r\n");
            if let Some(h) = original_host {
                (l[6], l[7], l[8]) = (b"x-forwarded-host: ", h.as_bytes(), b"\r\n");
            }
            l[9] = b"x-forwarded-proto: http\r\nvia: 1.1 flexinfer-proxy\r\n";
        }
        if self.load_report {
            l[10] = orca::REQUEST_LINE;
        }
        if let Some(t) = &self.traceparent {
            (l[11], l[12], l[13]) = (b"traceparent: ", t, b"\r\n");
        }
        for (piece, run) in l[14..].iter_mut().zip(self.relayed.runs()) {
            *piece = run;
        }
        l
    }
}

/// The `X-Forwarded-For` value of a client (made once per client connection).
pub fn client_ip_header(ip: std::net::IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is a valid header value")
}

/// Append the client to `X-Forwarded-For` and say we passed by (`Via`), in the map (a client
/// that sent forwarding headers; see [`AddedLines`]).
fn add_forwarding(
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
        for (i, &name) in HOP_BY_HOP.iter().enumerate() {
            let name = HeaderName::from_static(name);
            assert_eq!(hop_by_hop_index(&name), Some(i), "{name}");
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

    /// The lines as the encoder writes them.
    fn written(added: &AddedLines, host: &str) -> String {
        let host = HeaderValue::from_str(host).unwrap();
        let bytes: Vec<u8> = added.lines(&host).concat();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn forwarding_headers_go_in_lines_unless_the_client_sent_some() {
        let ip = client_ip_header("10.1.2.3".parse().unwrap());
        let mut h = HeaderMap::new();
        h.insert("x-session-id", HeaderValue::from_static("s"));
        let host = Some(HeaderValue::from_static("proxy:8080"));
        let mut added = AddedLines::forwarding(&mut h, &ip, host.clone(), Relayed::default());
        assert_eq!(h.len(), 1, "the map is left alone");
        assert_eq!(
            written(&added, "10.0.0.9:8000"),
            "host: 10.0.0.9:8000\r\nx-forwarded-for: 10.1.2.3\r\nx-forwarded-host: proxy:8080\r\n\
             x-forwarded-proto: http\r\nvia: 1.1 flexinfer-proxy\r\n"
        );
        added.ask_load_report(&mut h);
        assert_eq!(h.len(), 1);
        assert!(written(&added, "p")
            .ends_with("via: 1.1 flexinfer-proxy\r\nendpoint-load-metrics-format: text\r\n"));
        // Without an original host, no X-Forwarded-Host.
        let added = AddedLines::forwarding(&mut h, &ip, None, Relayed::default());
        assert!(!written(&added, "p").contains("x-forwarded-host"));

        // A client that sent any of the three: the map is extended, the lines carry `Host`.
        for sent in ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"] {
            let mut h = HeaderMap::new();
            h.insert(sent, HeaderValue::from_static("https"));
            let added = AddedLines::forwarding(&mut h, &ip, host.clone(), Relayed::default());
            assert_eq!(written(&added, "p"), "host: p\r\n", "{sent}");
            assert_eq!(h["via"], "1.1 flexinfer-proxy");
            assert!(h.contains_key(X_FORWARDED_FOR) && h.contains_key(X_FORWARDED_PROTO));
            assert!(h[sent].as_bytes().starts_with(b"https"), "{sent} kept");
        }
        // A client that sent the load-report request header: asking replaces its value.
        let mut h = HeaderMap::new();
        h.insert(
            "endpoint-load-metrics-format",
            HeaderValue::from_static("json"),
        );
        let mut added = AddedLines::forwarding(&mut h, &ip, None, Relayed::default());
        added.ask_load_report(&mut h);
        assert_eq!(h["endpoint-load-metrics-format"], "text");
        assert!(!written(&added, "p").contains("endpoint-load-metrics-format"));
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
