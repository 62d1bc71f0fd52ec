//! The body view: `BodyFields::parse` and every accessor on arbitrary bytes.
//!
//! The view promises the answers of a typed `serde_json` reading of the body (module docs of
//! `routing_userspace::body`), so the target holds it to one: [`Oracle`] is such a reading,
//! written here from the documented rules (top-level fields as raw values, a repeated field is
//! an error, a wrong type reads as absent, one malformed message hides them all). On top of that:
//! parse never panics, a view exists only for UTF-8 input, the depth limit is monotonic,
//! decoding agrees with itself (`decode`, `chars`, `eq_str`), `model_span` lies inside the input
//! and covers exactly the model's JSON value, and `rewrite_model` yields a body whose view reads
//! the new model and all the old other fields.
//!
//! Deliberate differences from serde, which the oracle skips: the view rejects nesting deeper
//! than its limit (serde skips ignored values at any depth) and non-UTF-8 bodies (serde does
//! not validate bytes inside ignored strings); it decodes an unpaired surrogate escape to
//! U+FFFD where serde's `String` refuses it, so the oracle reads the body with those escapes
//! written as `\uFFFD`.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use routing_userspace::body::{rewrite_model, BodyError, BodyFields, JsonStr, Text};
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct Oracle<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_key: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "cacheKey")]
    cache_key_camel: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prefix: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    document_context: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "documentContext")]
    document_context_camel: Option<&'a RawValue>,
    #[serde(borrow, default)]
    context: Option<&'a RawValue>,
    #[serde(borrow, default)]
    documents: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OracleMessage<'a> {
    #[serde(default)]
    role: Option<String>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OraclePart {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct OracleDoc {
    text: Option<String>,
    content: Option<String>,
}

fn string(raw: Option<&RawValue>) -> Option<String> {
    serde_json::from_str::<String>(raw?.get()).ok()
}

fn content(raw: &RawValue) -> Option<String> {
    match raw.get().as_bytes().first() {
        Some(b'"') => string(Some(raw)),
        Some(b'[') => {
            let parts: Vec<OraclePart> = serde_json::from_str(raw.get()).ok()?;
            let texts: Vec<String> = parts
                .into_iter()
                .filter(|p| {
                    p.kind
                        .as_deref()
                        .is_none_or(|k| k == "text" || k == "input_text")
                })
                .filter_map(|p| p.text)
                .collect();
            (!texts.is_empty()).then(|| texts.join(" "))
        }
        _ => None,
    }
}

impl<'a> Oracle<'a> {
    fn parse(body: &'a [u8]) -> Option<Self> {
        // A struct also deserializes from an array; a request body must be an object.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        serde_json::from_slice(body).ok()
    }

    fn messages(&self) -> Vec<OracleMessage<'a>> {
        self.messages
            .and_then(|m| serde_json::from_str(m.get()).ok())
            .unwrap_or_default()
    }

    fn system_texts(&self) -> Vec<String> {
        self.messages()
            .iter()
            .filter(|m| matches!(m.role.as_deref(), Some("system" | "developer")))
            .filter_map(|m| m.content.and_then(content))
            .collect()
    }

    fn first_user_text(&self) -> Option<String> {
        self.messages()
            .iter()
            .find(|m| m.role.as_deref() == Some("user"))
            .and_then(|m| m.content.and_then(content))
    }

    fn document_context(&self) -> Option<String> {
        let direct = [
            self.document_context,
            self.document_context_camel,
            self.context,
        ]
        .into_iter()
        .find_map(string);
        direct.or_else(|| {
            let docs: Vec<&RawValue> = serde_json::from_str(self.documents?.get()).ok()?;
            let first = *docs.first()?;
            string(Some(first)).or_else(|| {
                let d: OracleDoc = serde_json::from_str(first.get()).ok()?;
                d.text.or(d.content)
            })
        })
    }

    fn prompt_text(&self) -> Option<String> {
        let raw = self.prompt?;
        string(Some(raw)).or_else(|| {
            let list: Vec<String> = serde_json::from_str(raw.get()).ok()?;
            list.into_iter().next()
        })
    }
}

/// One decoded string, checked against itself: every way of reading it agrees.
fn decoded(s: JsonStr<'_>) -> String {
    let d = s.decode();
    let chars: String = s.chars().collect();
    assert_eq!(d, chars, "decode and chars disagree");
    assert!(s.eq_str(&d), "eq_str does not match its own decoding");
    d.into_owned()
}

fn text(t: &Text<'_>) -> String {
    let parts: Vec<String> = match t {
        Text::One(s) => vec![decoded(*s)],
        Text::Parts(v) => {
            assert!(v.len() >= 2, "a single part is Text::One");
            v.iter().map(|s| decoded(*s)).collect()
        }
    };
    let joined = parts.join(" ");
    assert_eq!(t.to_text(), joined);
    assert_eq!(t.chars().collect::<String>(), joined);
    joined
}

/// Everything the view answers, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answers {
    model: Option<String>,
    session_id: Option<String>,
    cache_key: Option<String>,
    cache_key_camel: Option<String>,
    prefix: Option<String>,
    has_messages: bool,
    system_texts: Vec<String>,
    first_user_text: Option<String>,
    document_context: Option<String>,
    prompt_text: Option<String>,
}

fn answers(f: &BodyFields<'_>) -> Answers {
    Answers {
        model: f.model().map(Cow::into_owned),
        session_id: f.session_id().map(Cow::into_owned),
        cache_key: f.cache_key().map(Cow::into_owned),
        cache_key_camel: f.cache_key_camel().map(Cow::into_owned),
        prefix: f.prefix().map(Cow::into_owned),
        has_messages: f.has_messages(),
        system_texts: f.system_texts().map(|t| text(&t)).collect(),
        first_user_text: f.first_user_text().map(|t| text(&t)),
        document_context: f.document_context().map(decoded),
        prompt_text: f.prompt_text().map(decoded),
    }
}

fn oracle_answers(o: &Oracle<'_>) -> Answers {
    Answers {
        model: string(o.model),
        session_id: string(o.session_id),
        cache_key: string(o.cache_key),
        cache_key_camel: string(o.cache_key_camel),
        prefix: string(o.prefix),
        has_messages: !o.messages().is_empty(),
        system_texts: o.system_texts(),
        first_user_text: o.first_user_text(),
        document_context: o.document_context(),
        prompt_text: o.prompt_text(),
    }
}

/// The input with every unpaired surrogate escape (`\uD800`..`\uDFFF` not part of a pair)
/// written as `\uFFFD`, the same length: the view decodes unpaired surrogates to U+FFFD
/// (as Python's json, which the model servers run, keeps them), and serde's `String` refuses
/// them, so the oracle reads this text instead.
fn replace_unpaired_surrogates(data: &[u8]) -> Vec<u8> {
    fn hex4(b: &[u8]) -> Option<u16> {
        u16::from_str_radix(std::str::from_utf8(b.get(..4)?).ok()?, 16).ok()
    }
    let mut out = data.to_vec();
    let (mut i, mut in_string) = (0, false);
    while i < out.len() {
        match out[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                if out.get(i + 1) != Some(&b'u') {
                    i += 2;
                    continue;
                }
                match hex4(&out[i + 2..]) {
                    Some(0xD800..=0xDBFF)
                        if out.get(i + 6..i + 8) == Some(b"\\u")
                            && matches!(hex4(&out[i + 8..]), Some(0xDC00..=0xDFFF)) =>
                    {
                        i += 12;
                    }
                    Some(0xD800..=0xDFFF) => {
                        out[i + 2..i + 6].copy_from_slice(b"fffd");
                        i += 6;
                    }
                    _ => i += 2,
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// New models to splice in: plain, with escapes, non-ASCII, empty.
const NEW_MODELS: [&str; 4] = ["llama3:8b", "a\"b\\c\n\u{1F600}", "", "ünï/cödé"];

fuzz_target!(|data: &[u8]| {
    let view = BodyFields::parse_with_depth(data, routing_userspace::body::DEFAULT_MAX_DEPTH);
    // The depth limit only ever removes views.
    let shallow = data.first().map_or(0, |b| u32::from(b % 8));
    if BodyFields::parse_with_depth(data, shallow).is_ok() {
        assert!(
            view.is_ok(),
            "accepted at depth {shallow} but not at the default"
        );
    }
    let for_oracle = replace_unpaired_surrogates(data);
    let Ok(fields) = view else {
        if view.as_ref().err() == Some(&BodyError::NotObject) && std::str::from_utf8(data).is_ok() {
            if let Some(o) = Oracle::parse(&for_oracle) {
                panic!(
                    "the view rejected a body the typed reading accepts: model {:?}",
                    string(o.model)
                );
            }
        }
        return;
    };
    assert!(
        std::str::from_utf8(data).is_ok(),
        "a view of non-UTF-8 input"
    );
    let got = answers(&fields);
    let oracle =
        Oracle::parse(&for_oracle).expect("the typed reading rejects a body the view accepts");
    assert_eq!(
        got,
        oracle_answers(&oracle),
        "view and typed reading disagree"
    );

    // model_span: inside the input, exactly the raw JSON value of `model`.
    match fields.model_span(data) {
        Some(span) => {
            assert!(span.start < span.end && span.end <= data.len(), "{span:?}");
            let raw = &data[span.clone()];
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(raw).is_ok(),
                "the span is not one JSON value: {:?}",
                String::from_utf8_lossy(raw)
            );
            let value: serde_json::Value = match serde_json::from_slice(raw) {
                Ok(v) => v,
                // Valid JSON that Value refuses: a number out of f64 range somewhere in it.
                Err(_) => return,
            };
            assert!(!value.is_null(), "null reads as absent");
            assert_eq!(value.as_str().map(str::to_owned), got.model);
            for new in NEW_MODELS {
                let out = rewrite_model(data, &fields, new).expect("a model to rewrite");
                assert_eq!(&out[..span.start], &data[..span.start]);
                assert_eq!(
                    &out[out.len() - (data.len() - span.end)..],
                    &data[span.end..]
                );
                let f2 = BodyFields::parse(&out).expect("a rewritten body still parses");
                let mut want = got.clone();
                want.model = Some(new.to_owned());
                assert_eq!(
                    answers(&f2),
                    want,
                    "rewriting the model changed another field"
                );
            }
        }
        None => {
            assert_eq!(got.model, None);
            assert_eq!(rewrite_model(data, &fields, "m"), None);
        }
    }
});
