//! Body view tests: the scanner-based reading agrees with the typed `serde_json` reading
//! ([`super::reference`]) on generated bodies, including malformed, repeated and escaped fields.

use proptest::prelude::*;

use super::reference::RefFields;
use super::*;

#[test]
fn rewrites_only_the_model_value() {
    let body = br#"{ "messages": [{"role":"user","content":"model"}],  "model" :"alias" , "x":{"model":"inner"}}"#;
    let f = BodyFields::parse(body).unwrap();
    let out = rewrite_model(body, &f, "llama3:8b").unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{ "messages": [{"role":"user","content":"model"}],  "model" :"llama3:8b" , "x":{"model":"inner"}}"#
    );
    let none = br#"{"messages":[]}"#;
    assert_eq!(
        rewrite_model(none, &BodyFields::parse(none).unwrap(), "m"),
        None
    );
}

#[test]
fn reads_whether_the_answer_streams_without_making_stream_a_routing_field() {
    let streams = |b: &str| BodyFields::parse(b.as_bytes()).map(|f| f.streams());
    assert_eq!(streams(r#"{"model":"m","stream":true}"#), Some(true));
    assert_eq!(streams(r#"{"model":"m","stream":false}"#), Some(false));
    assert_eq!(streams(r#"{"model":"m"}"#), Some(false));
    assert_eq!(
        streams(r#"{"stream":"true"}"#),
        Some(false),
        "a string is not true"
    );
    // Repeated, the last one counts, and the body's routing fields still read (a repeated
    // routing field hides them all; `stream` is not one).
    let f = BodyFields::parse(br#"{"stream":false,"model":"m","stream":true}"#).unwrap();
    assert!(f.streams());
    assert_eq!(f.model().as_deref(), Some("m"));
    // Its value is still validated with the body.
    assert!(BodyFields::parse(br#"{"model":"m","stream":tru}"#).is_none());
}

#[test]
fn reads_fields_and_ignores_wrong_types() {
    let body = br#"{"model":"m","session_id":42,"cache_key":"k","messages":[
        {"role":"system","content":"S1"},
        {"role":"system","content":[{"type":"text","text":"S2a"},{"type":"image_url","image_url":{}},{"type":"text","text":"S2b"}]},
        {"role":"user","content":"U1"},{"role":"assistant","content":"A"},{"role":"user","content":"U2"}],
        "documents":[{"text":"D"}]}"#;
    let b = BodyFields::parse(body).unwrap();
    assert_eq!(b.model().as_deref(), Some("m"));
    assert_eq!(b.session_id(), None, "a number is not a session id");
    assert_eq!(b.cache_key().as_deref(), Some("k"));
    let systems: Vec<String> = b.system_texts().map(|t| t.to_text().into_owned()).collect();
    assert_eq!(systems, vec!["S1".to_string(), "S2a S2b".to_string()]);
    assert_eq!(b.first_user_text().unwrap().to_text(), "U1");
    assert_eq!(b.document_context().unwrap().decode(), "D");
}

#[test]
fn document_context_precedence() {
    let b =
        BodyFields::parse(br#"{"context":"C","documentContext":"DC","documents":["X"]}"#).unwrap();
    assert_eq!(b.document_context().unwrap().decode(), "DC");
    let b = BodyFields::parse(br#"{"documents":["X","Y"]}"#).unwrap();
    assert_eq!(b.document_context().unwrap().decode(), "X");
}

#[test]
fn not_an_object_is_none() {
    assert!(BodyFields::parse(b"").is_none());
    assert!(BodyFields::parse(b"[1]").is_none());
    assert!(BodyFields::parse(b"{broken").is_none());
    assert!(BodyFields::parse(br#"{"model":"a","model":"b"}"#).is_none());
}

#[test]
fn too_deep_is_reported_apart() {
    let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    assert_eq!(
        BodyFields::parse_with_depth(deep.as_bytes(), DEFAULT_MAX_DEPTH).err(),
        Some(BodyError::TooDeep)
    );
    assert!(BodyFields::parse_with_depth(deep.as_bytes(), 500).is_ok());
}

#[test]
fn messages_are_validated_as_any_value_while_they_are_read() {
    // The same depth limit inside `messages` as anywhere: the array at 1, a message at 2, a
    // content part list at 3.
    let nested = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"t"}]}]}"#;
    for (depth, ok) in [(3, false), (4, false), (5, true)] {
        assert_eq!(
            BodyFields::parse_with_depth(nested, depth).is_ok(),
            ok,
            "max depth {depth}"
        );
    }
    let deep = format!(r#"{{"messages":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    assert_eq!(
        BodyFields::parse_with_depth(deep.as_bytes(), DEFAULT_MAX_DEPTH).err(),
        Some(BodyError::TooDeep)
    );
    // A malformed message hides the messages, and the rest of the body still reads.
    let b = BodyFields::parse(
        br#"{"messages":[{"role":1,"content":"x"},{"role":"system","content":"S"}],"model":"m"}"#,
    )
    .unwrap();
    assert!(!b.has_messages());
    assert_eq!(b.model().as_deref(), Some("m"));
    // A repeated field in a message too.
    let b = BodyFields::parse(br#"{"messages":[{"role":"user","role":"user","content":"x"}]}"#)
        .unwrap();
    assert!(!b.has_messages());
    // A syntax error after a malformed message is still a syntax error.
    assert!(BodyFields::parse(br#"{"messages":[7, {"role":"user",}]}"#).is_none());
    assert!(BodyFields::parse(br#"{"messages":[{"role":"user"},]}"#).is_none());
    assert!(BodyFields::parse(br#"{"messages":[{"role":"user"} {"role":"user"}]}"#).is_none());
    // Not an array: no messages, and the value still has to be valid.
    assert!(!BodyFields::parse(br#"{"messages":{"role":"user"}}"#)
        .unwrap()
        .has_messages());
    assert!(BodyFields::parse(br#"{"messages":{"role":}}"#).is_none());
}

/// A JSON-ish tree rendered by hand, so bodies can repeat keys, escape key names and vary
/// white space (none of which `serde_json::Value` can express).
#[derive(Debug, Clone)]
enum J {
    Raw(&'static str),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

fn render(j: &J, out: &mut String) {
    match j {
        J::Raw(s) => out.push_str(s),
        J::Str(s) => out.push_str(s),
        J::Arr(v) => {
            out.push('[');
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render(x, out);
            }
            out.push(']');
        }
        J::Obj(v) => {
            out.push_str("{ ");
            for (i, (k, x)) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push(':');
                render(x, out);
            }
            out.push('}');
        }
    }
}

/// JSON string literals (already quoted and escaped) that the readers treat specially.
fn string_lit() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r#""system""#.to_string()),
        Just(r#""user""#.to_string()),
        Just(r#""developer""#.to_string()),
        Just(r#""assistant""#.to_string()),
        Just(r#""text""#.to_string()),
        Just(r#""input_text""#.to_string()),
        Just(r#""sys\u0074em""#.to_string()),
        Just(r#""  spaced \t out\n text  ""#.to_string()),
        Just(r#""h\u00e9llo \ud83d\ude00 w\"o\\rld""#.to_string()),
        Just(r#""""#.to_string()),
        "[a-z ]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ]
}

/// Object keys: the fields both readers look for (some escaped), and others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("role"),
        Just("content"),
        Just("type"),
        Just("text"),
        Just("model"),
        Just("mod\\u0065l"),
        Just("messages"),
        Just("session_id"),
        Just("cache_key"),
        Just("cacheKey"),
        Just("prefix"),
        Just("document_context"),
        Just("documentContext"),
        Just("context"),
        Just("documents"),
        Just("prompt"),
        Just("other"),
    ]
    .prop_map(|k| format!("\"{k}\""))
}

fn json() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Raw("null")),
        Just(J::Raw("true")),
        Just(J::Raw("-1.5e3")),
        Just(J::Raw("42")),
        string_lit().prop_map(J::Str),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            prop::collection::vec((key(), inner), 0..5).prop_map(J::Obj),
        ]
    })
}

/// A message-shaped value (mostly well formed, sometimes not).
fn message() -> impl Strategy<Value = J> {
    let content = prop_oneof![
        string_lit().prop_map(J::Str),
        Just(J::Raw("null")),
        prop::collection::vec(
            prop_oneof![
                (string_lit(), string_lit()).prop_map(|(t, x)| J::Obj(vec![
                    ("\"type\"".into(), J::Str(t)),
                    ("\"text\"".into(), J::Str(x)),
                ])),
                string_lit().prop_map(|x| J::Obj(vec![("\"text\"".into(), J::Str(x))])),
                json(),
            ],
            0..4
        )
        .prop_map(J::Arr),
        json(),
    ];
    prop_oneof![
        4 => (string_lit(), content.clone()).prop_map(|(r, c)| J::Obj(vec![
            ("\"role\"".into(), J::Str(r)),
            ("\"content\"".into(), c),
        ])),
        1 => (string_lit(), content).prop_map(|(r, c)| J::Arr(vec![J::Str(r), c])),
        1 => json(),
    ]
}

fn body() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        3 => prop::collection::vec(message(), 0..5)
            .prop_map(|m| ("\"messages\"".to_string(), J::Arr(m))),
        1 => prop::collection::vec(
                prop_oneof![string_lit().prop_map(J::Str), json()], 0..3)
            .prop_map(|d| ("\"documents\"".to_string(), J::Arr(d))),
        1 => prop::collection::vec(string_lit().prop_map(J::Str), 0..3)
            .prop_map(|p| ("\"prompt\"".to_string(), J::Arr(p))),
        3 => (key(), prop_oneof![string_lit().prop_map(J::Str), json()]),
    ];
    prop::collection::vec(field, 0..6).prop_map(|fields| {
        let mut s = String::new();
        render(&J::Obj(fields), &mut s);
        s
    })
}

fn texts<'a>(it: impl Iterator<Item = Text<'a>>) -> Vec<String> {
    it.map(|t| t.to_text().into_owned()).collect()
}

fn check_same(text: &str) -> Result<(), TestCaseError> {
    let bytes = text.as_bytes();
    let new = BodyFields::parse(bytes);
    let old = RefFields::parse(bytes);
    prop_assert_eq!(new.is_some(), old.is_some(), "parse of {}", text);
    let (Some(n), Some(o)) = (new, old) else {
        return Ok(());
    };
    let own = |c: Option<Cow<'_, str>>| c.map(Cow::into_owned);
    prop_assert_eq!(own(n.model()), o.model(), "model of {}", text);
    prop_assert_eq!(n.model_span(bytes), o.model_span(bytes));
    prop_assert_eq!(own(n.session_id()), o.session_id());
    prop_assert_eq!(own(n.cache_key()), o.cache_key());
    prop_assert_eq!(own(n.cache_key_camel()), o.cache_key_camel());
    prop_assert_eq!(own(n.prefix()), o.prefix());
    prop_assert_eq!(n.has_messages(), o.has_messages(), "messages of {}", text);
    prop_assert_eq!(
        texts(n.system_texts()),
        o.system_texts(),
        "systems of {}",
        text
    );
    prop_assert_eq!(
        n.first_user_text().map(|t| t.to_text().into_owned()),
        o.first_user_text(),
        "first user of {}",
        text
    );
    prop_assert_eq!(
        n.document_context().map(|d| d.decode().into_owned()),
        o.document_context(),
        "document of {}",
        text
    );
    prop_assert_eq!(
        n.prompt_text().map(|p| p.decode().into_owned()),
        o.prompt_text(),
        "prompt of {}",
        text
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn agrees_with_the_typed_reading(text in body()) {
        check_same(&text)?;
    }

    /// Cut anywhere, a body is invalid for both (or, rarely, still valid for both).
    #[test]
    fn truncated_bodies_agree(text in body(), cut in any::<prop::sample::Index>()) {
        let at = cut.index(text.len() + 1);
        if text.is_char_boundary(at) {
            check_same(&text[..at])?;
        }
    }
}
