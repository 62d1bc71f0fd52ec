//! Phase 2, read the body, but only when routing needs it.
//!
//! A body is read (up to the limit) when the model is named only in it, when the routing key
//! may come from it, or when it must be rewritten (`servedModelName`). Otherwise it streams
//! through to the pod untouched and unread, as a plain reverse proxy would pass it: the model
//! came from a header or the path, and the key from a header or is not needed.

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::errors::ApiError;
use crate::keys::{self, KeyLimits};
use crate::table::{ModelRoute, Route};
use crate::vocab::{LabelGroupMode, Strategy};

/// The client's body, read or still to be streamed.
pub enum ClientBody {
    Read(Bytes),
    Streamed(Incoming),
}

/// Whether routing `route` (already known from the head) needs to read the body.
pub fn route_needs_body(
    route: &Route,
    headers: &HeaderMap,
    limits: &KeyLimits,
    mode: LabelGroupMode,
) -> bool {
    let model_needs = |m: &ModelRoute| {
        m.spec.served_model_name.is_some() || keys::needs_body(m.spec.routing, headers, limits)
    };
    match route {
        Route::Model(m) => model_needs(m),
        Route::Group(g) => {
            let mode_needs = match mode {
                LabelGroupMode::Prefix => keys::needs_body(Strategy::Prefix, headers, limits),
                LabelGroupMode::Session => {
                    keys::needs_body(Strategy::SessionAffinity, headers, limits)
                }
                LabelGroupMode::RoundRobin | LabelGroupMode::LeastLoaded => false,
            };
            mode_needs || g.members.iter().any(|m| model_needs(m))
        }
    }
}

/// Read the body in full (413 past `limit`) when `need`, else keep it for streaming.
pub async fn read(body: Incoming, need: bool, limit: usize) -> Result<ClientBody, ApiError> {
    if !need {
        return Ok(ClientBody::Streamed(body));
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(ClientBody::Read(c.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(e) => Err(ApiError::bad_body(e)),
    }
}
