//! Phase 1, model resolution: `X-Model-ID` header > `/model/<name>/...` path prefix (stripped
//! before forwarding) > body `model` > the only model when just one is configured. This file
//! reads the first two, which need no body.

use std::borrow::Cow;

use http::uri::PathAndQuery;
use http::HeaderMap;

pub const HEADER_MODEL_ID: http::HeaderName = http::HeaderName::from_static("x-model-id");

/// Where the model name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFrom {
    Header,
    Path,
    Body,
    OnlyModel,
}

/// What the request's head names: the model (header first, then path prefix), and the path
/// to forward when the prefix had to be stripped.
#[derive(Debug, Default)]
pub struct Named<'a> {
    pub model: Option<Cow<'a, str>>,
    pub forward_path: Option<PathAndQuery>,
}

/// Read the model from the head of a request (no body).
pub fn named<'a>(headers: &'a HeaderMap, uri: &'a http::Uri) -> Named<'a> {
    let header = header_model(headers);
    match split_model_path(uri.path()) {
        Some((name, rest)) => {
            let forward = match uri.query() {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_owned(),
            };
            Named {
                model: header.map(Cow::Borrowed).or(Some(name)),
                // A path cut from a valid path is valid.
                forward_path: PathAndQuery::try_from(forward).ok(),
            }
        }
        None => Named {
            model: header.map(Cow::Borrowed),
            forward_path: None,
        },
    }
}

/// A `/model/<name>/rest` path split into the name and the path to forward (`/rest`).
pub fn split_model_path(path: &str) -> Option<(Cow<'_, str>, &str)> {
    let rest = path.strip_prefix("/model/")?;
    let (name, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let name = percent_decode(name)?;
    (!name.is_empty()).then_some((name, tail))
}

/// The model named by the `X-Model-ID` header.
pub fn header_model(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(HEADER_MODEL_ID)?.to_str().ok()?.trim();
    (!v.is_empty()).then_some(v)
}

/// Decode `%XX` escapes; `None` on a broken escape or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains('%') {
        return Some(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefix() {
        assert_eq!(
            split_model_path("/model/llama/v1/chat/completions"),
            Some(("llama".into(), "/v1/chat/completions"))
        );
        assert_eq!(
            split_model_path("/model/llama3%3A8b/v1/models"),
            Some(("llama3:8b".into(), "/v1/models"))
        );
        assert_eq!(split_model_path("/model/x"), Some(("x".into(), "/")));
        let uri: http::Uri = "/model/a/v1/x?y=1".parse().unwrap();
        let h = HeaderMap::new();
        let n = named(&h, &uri);
        assert_eq!(n.model.as_deref(), Some("a"));
        assert_eq!(n.forward_path.unwrap().as_str(), "/v1/x?y=1");
        assert_eq!(split_model_path("/model//v1"), None);
        assert_eq!(split_model_path("/v1/chat/completions"), None);
        assert_eq!(split_model_path("/model/bad%zz/v1"), None);
    }
}
