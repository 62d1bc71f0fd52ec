//! Routing key extraction: arbitrary request headers and body bytes through
//! `BodyFields::parse` and `keys::extract`, for every strategy, with default and tiny limits.
//!
//! Extraction runs on every request a client can shape freely, so beyond "never panics" the
//! target checks the precedence rules that do not depend on the body's meaning: which sources a
//! strategy may answer with, that a usable header wins, that `needs_body` is right when it says
//! the body is not needed, that skipped keys really are malformed, and that the streamed key
//! hash equals hashing the text at once.
#![no_main]

use flexinfer_fuzz::headers_and_body;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use routing_userspace::body::BodyFields;
use routing_userspace::keys::canonical::{context_text, cut, normalize, normalize_prefix};
use routing_userspace::keys::explicit::{validate, Malformed};
use routing_userspace::keys::session::implicit;
use routing_userspace::keys::{
    chain, extract, hash_key, needs_body, Extraction, KeyHasher, KeyLimits, KeySource,
    RequestParts, RoutingKey, HEADER_CACHE_KEY, HEADER_CONVERSATION_ID, HEADER_SESSION_ID,
};
use routing_userspace::proxy::resolve::header_model;
use routing_userspace::vocab::Strategy;

const TINY: KeyLimits = KeyLimits {
    explicit_key_max_length: 4,
    system_segment_max_length: 3,
    document_segment_max_length: 2,
};

fn header_text<'h>(h: &'h HeaderMap, name: &http::HeaderName) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn streamed_hash(s: &str) -> u64 {
    let mut h = KeyHasher::default();
    h.push_str(s);
    h.finish()
}

fn check_normalize(s: &str, max: usize) {
    let n = normalize(s);
    assert_eq!(normalize_prefix(s, max), cut(&n, max), "{s:?} cut to {max}");
    assert!(n.chars().all(|c| c == ' ' || !c.is_whitespace()), "{n:?}");
    assert!(
        !n.starts_with(' ') && !n.ends_with(' ') && !n.contains("  "),
        "{n:?}"
    );
}

fn check(strategy: Strategy, req: &RequestParts<'_, '_>, limits: &KeyLimits) -> Extraction {
    let got = extract(strategy, req, limits);
    assert_eq!(
        got,
        extract(strategy, req, limits),
        "extraction is a pure function"
    );
    for i in &got.ignored {
        assert!(
            matches!(
                i.source,
                KeySource::ExplicitHeader | KeySource::ExplicitBody | KeySource::PrefixField
            ),
            "only explicit keys are reported as ignored: {i:?}"
        );
        if let Malformed::TooLong { len, max } = i.reason {
            assert!(len > max && max == limits.explicit_key_max_length, "{i:?}");
        }
    }
    let session_sources = [
        KeySource::SessionHeader,
        KeySource::ConversationHeader,
        KeySource::SessionBody,
        KeySource::ImplicitSession,
    ];
    let headers = req.headers;
    let session_header = header_text(headers, &HEADER_SESSION_ID)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let conversation_header = header_text(headers, &HEADER_CONVERSATION_ID)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let session_want = session_header
        .map(|s| RoutingKey::new(s, KeySource::SessionHeader))
        .or_else(|| conversation_header.map(|s| RoutingKey::new(s, KeySource::ConversationHeader)));
    match strategy {
        Strategy::Default | Strategy::LeastLoaded => {
            assert_eq!(got, Extraction::default(), "{strategy:?} uses no key");
        }
        Strategy::SessionAffinity => {
            assert!(got.ignored.is_empty());
            if let Some(k) = got.key {
                assert!(session_sources.contains(&k.source), "{k:?}");
            }
            if let Some(want) = session_want {
                assert_eq!(got.key, Some(want), "a usable session header wins");
            }
            if got.key.map(|k| k.source) == Some(KeySource::ImplicitSession) {
                assert_eq!(got.key, implicit(req));
            }
        }
        Strategy::Prefix => {
            let explicit = header_text(headers, &HEADER_CACHE_KEY)
                .and_then(|v| validate(v, limits.explicit_key_max_length).ok());
            if let Some(k) = explicit {
                assert_eq!(got.key, Some(RoutingKey::new(k, KeySource::ExplicitHeader)));
                assert!(
                    got.ignored.is_empty(),
                    "nothing is skipped before the header"
                );
            }
            match got.key.map(|k| k.source) {
                Some(KeySource::Canonical) => {
                    let text = context_text(req, limits).expect("a canonical key has a text");
                    assert_eq!(got.key.unwrap().hash, hash_key(&text));
                    let model_chars = req.model.map_or(0, |m| m.chars().count())
                        + req
                            .body
                            .and_then(|b| b.model())
                            .map_or(0, |m| m.chars().count());
                    let bound = model_chars
                        + limits.system_segment_max_length
                        + limits.document_segment_max_length
                        + "model=\x1fsystem=\x1fdocument=".len();
                    assert!(text.chars().count() <= bound, "segments are cut: {text:?}");
                }
                Some(s) if session_sources.contains(&s) => {
                    assert!(context_text(req, limits).is_none(), "canonical comes first");
                }
                _ => {}
            }
        }
        Strategy::CacheAware => {
            let explicit = header_text(headers, &HEADER_CACHE_KEY)
                .and_then(|v| validate(v, limits.explicit_key_max_length).ok());
            if let Some(k) = explicit {
                assert_eq!(got.key, Some(RoutingKey::new(k, KeySource::ExplicitHeader)));
            }
            if got.key.map(|k| k.source) == Some(KeySource::PromptChain) {
                let c = chain::chain(req).expect("a prompt-chain key has a chain");
                assert_eq!(got.key, Some(c.key()), "the key is the chain's first link");
                assert!(c.links().len() <= chain::MAX_LINKS);
            }
        }
    }
    got
}

fuzz_target!(|data: &[u8]| {
    let (headers, body) = headers_and_body(data);
    let fields = BodyFields::parse(body);
    let model = header_model(&headers).map(str::to_owned);
    for v in headers.values() {
        if let Ok(s) = v.to_str() {
            assert_eq!(hash_key(s), streamed_hash(s));
            check_normalize(s, 5);
        }
    }
    if let Some(f) = &fields {
        for t in f.system_texts().chain(f.first_user_text()) {
            let s = t.to_text();
            assert_eq!(hash_key(&s), streamed_hash(&s));
            check_normalize(&s, 7);
        }
    }
    for limits in [KeyLimits::default(), TINY] {
        for strategy in Strategy::ALL {
            for routed in [None, model.as_deref()] {
                let req = RequestParts {
                    headers: &headers,
                    body: fields.as_ref(),
                    model: routed,
                };
                let got = check(strategy, &req, &limits);
                if !needs_body(strategy, &headers, &limits) {
                    let no_body = RequestParts {
                        headers: &headers,
                        body: None,
                        model: routed,
                    };
                    let without = extract(strategy, &no_body, &limits).key;
                    assert_eq!(got.key, without, "needs_body said the body does not matter");
                }
            }
        }
    }
});
