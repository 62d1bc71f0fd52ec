//! Explicit cache keys (spec: "Explicit Cache-Key Contract"): the header, then body
//! `cache_key` / `cacheKey`, then the legacy body `prefix`. A key is normalized (surrounding
//! white space trimmed) and must be 1..=max characters of `A-Za-z0-9._:/=-`; anything else is
//! ignored and the next source is tried.

use std::borrow::Cow;

use super::{header, Ignored, KeyLimits, KeySource, RequestParts, RoutingKey, HEADER_CACHE_KEY};

/// Why an explicit key was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    Empty,
    TooLong { len: usize, max: usize },
    BadCharacter,
}

fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'=' | b'-')
}

/// Normalize and validate an explicit key.
pub fn validate(raw: &str, max: usize) -> Result<&str, Malformed> {
    let key = raw.trim();
    if key.is_empty() {
        return Err(Malformed::Empty);
    }
    if !key.bytes().all(allowed) {
        return Err(Malformed::BadCharacter);
    }
    // Every allowed character is one byte, so bytes are characters here.
    if key.len() > max {
        return Err(Malformed::TooLong {
            len: key.len(),
            max,
        });
    }
    Ok(key)
}

/// The first valid explicit key, recording the malformed ones it skipped.
pub fn key(
    req: &RequestParts<'_, '_>,
    limits: &KeyLimits,
    ignored: &mut Vec<Ignored>,
) -> Option<RoutingKey> {
    let body = req.body;
    let candidates: [(KeySource, Option<Cow<'_, str>>); 4] = [
        (
            KeySource::ExplicitHeader,
            header(req.headers, &HEADER_CACHE_KEY).map(Cow::Borrowed),
        ),
        (KeySource::ExplicitBody, body.and_then(|b| b.cache_key())),
        (
            KeySource::ExplicitBody,
            body.and_then(|b| b.cache_key_camel()),
        ),
        (KeySource::PrefixField, body.and_then(|b| b.prefix())),
    ];
    for (source, value) in candidates {
        let Some(value) = value else { continue };
        match validate(&value, limits.explicit_key_max_length) {
            Ok(k) => return Some(RoutingKey::new(k, source)),
            Err(reason) => ignored.push(Ignored { source, reason }),
        }
    }
    // A header that is present but not UTF-8 is malformed too.
    if req.headers.contains_key(HEADER_CACHE_KEY)
        && header(req.headers, &HEADER_CACHE_KEY).is_none()
    {
        ignored.insert(
            0,
            Ignored {
                source: KeySource::ExplicitHeader,
                reason: Malformed::BadCharacter,
            },
        );
    }
    None
}
