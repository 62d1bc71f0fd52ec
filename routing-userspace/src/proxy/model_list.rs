//! `GET /v1/models` and `GET /v1/models/<id>` for requests that name no model: the proxy
//! answers them itself, from the routing table (every model and label, or the one asked for).

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

use super::errors::ApiError;
use crate::table::RoutingTable;

/// `GET /v1/models` and `GET /v1/models/<id>` that name no model: every configured model and
/// label, or the one asked for (404 if there is none); `None` for any other path.
pub fn answer(table: &RoutingTable, path: &str) -> Option<Result<Response<Full<Bytes>>, ApiError>> {
    let rest = path.strip_prefix("/v1/models")?;
    let mut ids: Vec<String> = table.models().map(|m| m.name.to_string()).collect();
    ids.extend(table.groups().map(|g| g.label.to_string()));
    ids.sort();
    ids.dedup();
    let object =
        |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "flexinfer"});
    let body = match rest {
        "" | "/" => {
            let data: Vec<_> = ids.iter().map(|id| object(id)).collect();
            json!({"object": "list", "data": data})
        }
        _ => {
            let id = rest.strip_prefix('/')?; // not `/v1/modelsfoo`
            match ids.iter().find(|i| *i == id) {
                Some(id) => object(id),
                None => return Some(Err(ApiError::model_not_found(id))),
            }
        }
    };
    Some(Ok(json_response(body)))
}

fn json_response(body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
