//! Phase 1, model resolution: `X-Model-ID` header > `/model/<name>/...` path prefix (stripped
//! before forwarding) > body `model` > the only model when just one is configured. [`named`]
//! reads the first two, which need no body; [`complete`] finishes once the body was read (if
//! routing needed it), and also answers `GET /v1/models` requests that name no model.

use std::borrow::Cow;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Response};
use http_body_util::Full;

use super::errors::ApiError;
use super::model_list;
use crate::body::BodyFields;
use crate::table::{Route, RoutingTable};

pub const HEADER_MODEL_ID: http::HeaderName = http::HeaderName::from_static("x-model-id");

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

/// The route the head names, if it names a model (404 if the table has no such model).
pub fn lookup(table: &RoutingTable, named: Option<&str>) -> Result<Option<Route>, ApiError> {
    named
        .map(|name| {
            table
                .lookup(name)
                .ok_or_else(|| ApiError::model_not_found(name))
        })
        .transpose()
}

/// What model resolution came to once the body (if routing read it) is known.
pub enum Resolved {
    Route(Route),
    /// A request the proxy answers itself: the model list.
    Local(Response<Full<Bytes>>),
}

/// The request as model resolution sees it once the body was read.
pub struct Request<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    /// The body's fields, if it was read and is a JSON object.
    pub fields: Option<&'a BodyFields<'a>>,
    /// A body was there but is not a JSON object (it cannot name a model).
    pub unreadable: bool,
}

/// Finish model resolution: the head's route, else the body's `model`, else the only model;
/// else a `GET`/`HEAD` of the model list is answered here; else the request names no model.
pub fn complete(
    table: &RoutingTable,
    from_head: Option<Route>,
    req: &Request<'_>,
) -> Result<Resolved, ApiError> {
    if let Some(route) = from_head {
        return Ok(Resolved::Route(route));
    }
    if let Some(name) = req.fields.and_then(|f| f.model()) {
        return match table.lookup(&name) {
            Some(route) => Ok(Resolved::Route(route)),
            None => Err(ApiError::model_not_found(&name)),
        };
    }
    if let Some(route) = table.only_model() {
        return Ok(Resolved::Route(route));
    }
    if matches!(*req.method, Method::GET | Method::HEAD) {
        return match model_list::answer(table, req.path) {
            Some(answer) => answer.map(Resolved::Local),
            None => Err(ApiError::model_required()),
        };
    }
    Err(match req.unreadable {
        true => ApiError::model_in_unreadable_body(),
        false => ApiError::model_required(),
    })
}

/// A `/model/<name>/rest` path split into the name and the path to forward (`/rest`).
pub fn split_model_path(path: &str) -> Option<(Cow<'_, str>, &str)> {
    let rest = path.strip_prefix("/model/")?;
    let (name, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let name = crate::percent::decode(name)?;
    (!name.is_empty()).then_some((name, tail))
}

/// The model named by the `X-Model-ID` header.
pub fn header_model(headers: &HeaderMap) -> Option<&str> {
    let v = crate::header_lookup::header(headers, &HEADER_MODEL_ID)?
        .to_str()
        .ok()?
        .trim();
    (!v.is_empty()).then_some(v)
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
