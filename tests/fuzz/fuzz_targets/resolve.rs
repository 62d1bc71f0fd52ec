//! Model resolution from the request head: `resolve::named` on arbitrary URIs and header
//! values, then the rest of the head's way to the pod (`prepare::origin_uri`, `prepare::head`,
//! `h1::head::encode_request`), which the resolved path feeds.
//!
//! Input: the first line is the request target (any bytes `http::Uri` accepts), the remaining
//! lines are `name: value` headers. Checked: the header wins over the path, a `/model/<name>/`
//! prefix is split, decoded and stripped (and always leaves a valid path, as `named` assumes),
//! a percent-encoded name round-trips, and the upstream head the proxy writes is one HTTP/1.1
//! request that `httparse` reads back with the same target and no hop-by-hop header left (so
//! nothing a client sends can split it into two).
#![no_main]

use std::borrow::Cow;

use flexinfer_fuzz::headers_and_body;
use http::{header, HeaderMap, HeaderValue, Method, Request, Uri};
use libfuzzer_sys::fuzz_target;
use routing_userspace::proxy::relayed::Relayed;
use routing_userspace::proxy::{prepare, resolve};
use routing_userspace::upstream::h1::head::{encode_request, BodyFraming, HOP_BY_HOP};

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn check_split(uri: &Uri, headers: &HeaderMap) {
    let named = resolve::named(headers, uri);
    let header = resolve::header_model(headers);
    if let Some(h) = header {
        assert_eq!(h, h.trim());
        assert!(!h.is_empty());
        assert_eq!(named.model.as_deref(), Some(h), "the header wins");
    }
    match resolve::split_model_path(uri.path()) {
        Some((name, rest)) => {
            assert!(!name.is_empty());
            assert!(rest.starts_with('/'), "{rest:?}");
            let raw = &uri.path()["/model/".len()..];
            let raw_name = raw.split('/').next().unwrap_or_default();
            if !raw_name.contains('%') {
                assert!(matches!(name, Cow::Borrowed(_)));
                assert_eq!(name, raw_name);
            }
            let forward = named
                .forward_path
                .as_ref()
                .expect("a path cut from a valid path is valid");
            let want = match uri.query() {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_owned(),
            };
            assert_eq!(forward.as_str(), want);
            if header.is_none() {
                assert_eq!(named.model.as_deref(), Some(&*name));
            }
            // The decoded name, encoded again, names the same model.
            let again: Uri = format!("/model/{}{rest}", percent_encode(&name))
                .parse()
                .expect("an encoded name is a valid path");
            let (name2, rest2) = resolve::split_model_path(again.path()).expect("still a prefix");
            assert_eq!((name2, rest2), (name.clone(), rest));
        }
        None => {
            assert!(named.forward_path.is_none());
            assert_eq!(named.model.as_deref(), header);
        }
    }
}

fn check_upstream_head(uri: &Uri, headers: &HeaderMap, method: Method) {
    let named = resolve::named(headers, uri);
    let target = prepare::origin_uri(uri, named.forward_path);
    assert!(target.scheme().is_none() && target.authority().is_none());
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri.clone();
    *req.headers_mut() = headers.clone();
    let (mut parts, ()) = req.into_parts();
    let client_ip = HeaderValue::from_static("127.0.0.1");
    let added = prepare::head(
        &mut parts,
        Relayed::default(),
        target.clone(),
        &client_ip,
        Some(0),
    );
    for name in HOP_BY_HOP {
        assert!(!parts.headers.contains_key(name), "{name} forwarded");
    }
    assert!(!parts.headers.contains_key(header::HOST));
    let host = HeaderValue::from_static("10.0.0.1:8000");
    let lines = added.lines(&host);
    let added_lines = lines.concat().iter().filter(|&&b| b == b'\n').count();
    let mut out = Vec::new();
    encode_request(&mut out, &parts, &lines, BodyFraming::AsIs);
    let mut fields = vec![httparse::EMPTY_HEADER; parts.headers.len() + added_lines + 1];
    let mut r = httparse::Request::new(&mut fields);
    match r.parse(&out) {
        Ok(httparse::Status::Complete(n)) => {
            assert_eq!(n, out.len(), "the head ends where it was written to end");
            assert_eq!(r.method, Some(parts.method.as_str()));
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            assert_eq!(r.path, Some(path));
            assert_eq!(r.headers.len(), parts.headers.len() + added_lines);
            let hosts = r.headers.iter().filter(|h| h.name == "host").count();
            assert_eq!(hosts, 1, "the attempt's Host, once");
        }
        other => panic!("the upstream head does not parse: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let (first, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    let first = first.strip_suffix(b"\r").unwrap_or(first);
    let (headers, _) = headers_and_body(rest);
    // The header alone, against a plain path.
    check_split(&Uri::from_static("/v1/chat/completions"), &headers);
    let Ok(uri) = Uri::try_from(first) else {
        return;
    };
    check_split(&uri, &headers);
    check_split(&uri, &HeaderMap::new());
    let method = match data.len() % 3 {
        0 => Method::POST,
        1 => Method::GET,
        _ => Method::HEAD,
    };
    check_upstream_head(&uri, &headers, method);
});
