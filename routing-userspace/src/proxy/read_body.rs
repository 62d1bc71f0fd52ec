//! Phase 2, read the body, but only when routing needs it.
//!
//! A body is read (up to the limit) when the model is named only in it, when the routing key
//! may come from it, or when it must be rewritten (`servedModelName`). Otherwise it streams
//! through to the pod untouched and unread, as a plain reverse proxy would pass it: the model
//! came from a header or the path, and the key from a header or is not needed.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body as _;
use http_body_util::BodyExt;

use super::errors::ApiError;
use super::request_body::RequestBody;
use crate::keys::{self, KeyLimits};
use crate::table::{ModelRoute, Route};
use crate::vocab::{LabelGroupMode, Strategy};

/// The client's body, read or still to be streamed.
pub enum ClientBody {
    Read(Bytes),
    Streamed(RequestBody),
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
pub async fn read(body: RequestBody, need: bool, limit: usize) -> Result<ClientBody, ApiError> {
    if !need {
        return Ok(ClientBody::Streamed(body));
    }
    let mut body = body;
    if body.size_hint().exact().is_some_and(|n| n > limit as u64) {
        linger(body).await;
        return Err(ApiError::body_too_large(limit));
    }
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(ApiError::bad_body)?.into_data() else {
            continue; // trailers
        };
        total += data.len();
        if total > limit {
            linger(body).await;
            return Err(ApiError::body_too_large(limit));
        }
        // One frame (the common case) is kept as is; more are joined.
        match first.take() {
            None if rest.is_empty() => first = Some(data),
            Some(f) => {
                rest.reserve(total);
                rest.extend_from_slice(&f);
                rest.extend_from_slice(&data);
            }
            None => rest.extend_from_slice(&data),
        }
    }
    Ok(ClientBody::Read(first.unwrap_or_else(|| rest.freeze())))
}

/// Most of an oversized body the proxy reads and discards before it answers 413.
const LINGER_BYTES: usize = 64 << 20;
/// Longest it waits for that.
const LINGER_TIME: Duration = Duration::from_secs(10);

/// Reads and discards what is left of an oversized body, so the 413 reaches a client that
/// writes its whole body before it reads: answering mid-upload closes the connection on
/// unread data, which resets it and loses the answer. Bounded in bytes and time.
pub async fn linger(mut body: RequestBody) {
    let deadline = tokio::time::sleep(LINGER_TIME);
    tokio::pin!(deadline);
    let mut left = LINGER_BYTES;
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            frame = body.frame() => match frame {
                Some(Ok(f)) => {
                    let n = f.data_ref().map_or(0, Bytes::len);
                    left = left.saturating_sub(n);
                    if left == 0 {
                        return;
                    }
                }
                _ => return,
            },
        }
    }
}
