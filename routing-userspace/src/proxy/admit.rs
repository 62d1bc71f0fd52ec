//! Phase 0, admit: what the request's head alone makes the proxy refuse, before anything is
//! looked up or read. This is not a forward proxy (no `CONNECT` tunnels, no `TRACE`, no
//! absolute-form targets aimed at other hosts), the head has a size limit (431), and a declared
//! body past the body limit is refused before a byte of it is read (413).

use http::header;
use http::request::Parts;
use http::Method;

use super::errors::ApiError;
use super::relayed::Relayed;
use super::RequestLimits;

/// Refuse what the head alone rules out (its fields: `parts`' map and the `relayed` lines).
pub fn head(parts: &Parts, relayed: &Relayed, limits: &RequestLimits) -> Result<(), ApiError> {
    if parts.method == Method::CONNECT || parts.method == Method::TRACE {
        return Err(ApiError::method_not_allowed(&parts.method));
    }
    if parts.version < http::Version::HTTP_2 && parts.uri.scheme().is_some() {
        return Err(ApiError::absolute_form());
    }
    if head_bytes(parts) + relayed.len() > limits.max_header_bytes {
        return Err(ApiError::header_too_large(limits.max_header_bytes));
    }
    let limit = limits.max_body_bytes;
    if declared_length(parts).is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    Ok(())
}

/// The size of the request target and the map's headers, as the limit counts it (each header
/// line with its `: ` and CRLF).
fn head_bytes(parts: &Parts) -> usize {
    let target = parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
    let headers: usize = parts
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    target + headers
}

/// The body length the client declared, if it declared one that parses.
fn declared_length(parts: &Parts) -> Option<u64> {
    crate::header_lookup::header(&parts.headers, &header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}
