//! Canonical context (spec: "Prefix-Based Routing", step 4): the routed model identity, every
//! system message, and the optional document context, each normalized and cut to its knob
//! length, hashed together. Requests that share a system prompt and document share a key.
//!
//! Normalization collapses every run of white space to one space and trims the ends, so
//! formatting noise does not split a shared prefix. A request with neither system text nor
//! document context has no canonical key (the model alone is not a context).
//!
//! A `/v1/completions` request has no messages; its `prompt` then stands in for the system
//! segment (cut to the same length), so shared prompt prefixes route together there too.

use super::normalize::Normalizer;
use super::{KeyLimits, KeySource, RequestParts, RoutingKey};
use crate::body::Text;

/// Collapse white-space runs to one space and trim.
pub fn normalize(s: &str) -> String {
    normalize_prefix(s, usize::MAX)
}

/// The first `max` characters of `normalize(s)`, without normalizing the rest: a long system
/// prompt or document costs only its first segment.
pub fn normalize_prefix(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max.saturating_mul(4)));
    normalize_chars(s.chars(), max, |c| out.push(c));
    out
}

/// Feed the characters of `normalize(chars)` to `emit`, stopping after `max` of them; the
/// input is read only as far as needed. Returns how many were emitted.
pub fn normalize_chars(
    chars: impl Iterator<Item = char>,
    max: usize,
    mut emit: impl FnMut(char),
) -> usize {
    let mut emitted = 0usize;
    let mut gap = false;
    for c in chars {
        if c.is_whitespace() {
            gap = emitted > 0;
            continue;
        }
        if gap {
            if emitted >= max {
                break;
            }
            emit(' ');
            emitted += 1;
            gap = false;
        }
        if emitted >= max {
            break;
        }
        emit(c);
        emitted += 1;
    }
    emitted
}

/// [`normalize_prefix`] of a body text.
fn normalize_text(t: &Text<'_>, max: usize) -> String {
    super::normalize::text_prefix(t, max)
}

/// The first `max` characters of `s`.
pub fn cut(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The canonical context text (before hashing); `None` when there is no context.
pub fn context_text(req: &RequestParts<'_, '_>, limits: &KeyLimits) -> Option<String> {
    let body = req.body?;
    // Only the first `max` characters of each segment survive the cut below, so each text is
    // normalized only that far: a long prompt costs its segment, not its length. (A joined
    // system message can contribute at most `max` characters, so cutting each one first to
    // `max` leaves the joined prefix unchanged.)
    let (sys_max, doc_max) = (
        limits.system_segment_max_length,
        limits.document_segment_max_length,
    );
    let mut system = String::with_capacity(sys_max.min(4096) + 8);
    if body.has_messages() {
        // Each message normalized straight into the joined text, `\n` between them.
        let mut chars = 0usize;
        for text in body.system_texts() {
            // Whatever follows the first `sys_max` characters is cut away below.
            if chars >= sys_max {
                break;
            }
            let mark = system.len();
            if mark > 0 {
                system.push('\n');
            }
            let mut n = Normalizer::new(sys_max);
            n.feed_text(&text, &mut system);
            if n.emitted() == 0 {
                system.truncate(mark);
                continue;
            }
            chars += n.emitted() + usize::from(mark > 0);
        }
        if chars > sys_max {
            let keep = cut(&system, sys_max).len();
            system.truncate(keep);
        }
    } else if let Some(p) = body.prompt_text() {
        Normalizer::new(sys_max).feed_json(&p, &mut system);
    }
    // At most `doc_max` characters come out: nothing to cut.
    let document = body
        .document_context()
        .map(|d| normalize_text(&Text::One(d), doc_max))
        .unwrap_or_default();
    if system.is_empty() && document.is_empty() {
        return None;
    }
    let model = match req.model {
        Some(m) => std::borrow::Cow::Borrowed(m),
        None => body.model().unwrap_or_default(),
    };
    Some(format!(
        "model={model}\x1fsystem={system}\x1fdocument={document}"
    ))
}

pub fn key(req: &RequestParts<'_, '_>, limits: &KeyLimits) -> Option<RoutingKey> {
    context_text(req, limits).map(|t| RoutingKey::new(&t, KeySource::Canonical))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_prefix_equals_cutting_the_normalized_text() {
        let samples = [
            "  a  bb\tccc\n dddd ",
            "",
            "   ",
            "one",
            "héllo   wörld  ünïcode text",
        ];
        for s in samples {
            for max in [0, 1, 2, 3, 5, 8, 13, 100] {
                assert_eq!(
                    normalize_prefix(s, max),
                    cut(&normalize(s), max),
                    "{s:?} {max}"
                );
            }
        }
    }
}
