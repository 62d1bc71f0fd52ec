//! Table tests for every precedence list and safety rule of the spec. Each row names the
//! headers and body of a request and the exact key (as the text it must hash) and source.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::explicit::{validate, Malformed};
use super::*;

const SYS: &str = r#"{"role":"system","content":"You are terse."}"#;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn run(strategy: Strategy, hdrs: &[(&str, &str)], body: &str, limits: &KeyLimits) -> Extraction {
    let h = headers(hdrs);
    let fields = BodyFields::parse(body.as_bytes());
    extract(
        strategy,
        &RequestParts {
            headers: &h,
            body: fields.as_ref(),
            model: Some("m"),
        },
        limits,
    )
}

fn canon(system: &str, document: &str) -> String {
    format!("model=m\x1fsystem={system}\x1fdocument={document}")
}

fn implicit(systems: &[&str], user: &str) -> String {
    let mut t = String::from("implicit\x1f");
    for s in systems {
        t.push_str(s);
        t.push('\x1e');
    }
    t.push('\x1f');
    t.push_str(user);
    t
}

struct Row {
    name: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: String,
    want: Option<(String, KeySource)>,
}

fn check(strategy: Strategy, rows: Vec<Row>) {
    let limits = KeyLimits::default();
    for row in rows {
        let got = run(strategy, row.headers, &row.body, &limits).key;
        let want = row
            .want
            .map(|(text, source)| RoutingKey::new(&text, source));
        assert_eq!(got, want, "{strategy} row {:?}", row.name);
    }
}

fn chat(extra: &str, messages: &str) -> String {
    let sep = if extra.is_empty() { "" } else { "," };
    format!(r#"{{"model":"m","messages":[{messages}]{sep}{extra}}}"#)
}

#[test]
fn prefix_precedence() {
    let user = r#"{"role":"user","content":"hi"}"#;
    let msgs = format!("{SYS},{user}");
    let all = chat(
        r#""cache_key":"body-k","cacheKey":"camel-k","prefix":"legacy-k","document_context":"Doc","session_id":"s-body""#,
        &msgs,
    );
    let rows = vec![
        Row {
            name: "1 header beats everything",
            headers: &[("x-flexinfer-cache-key", "hdr-k"), ("x-session-id", "s")],
            body: all.clone(),
            want: Some(("hdr-k".into(), KeySource::ExplicitHeader)),
        },
        Row {
            name: "2 cache_key",
            headers: &[("x-session-id", "s")],
            body: all.clone(),
            want: Some(("body-k".into(), KeySource::ExplicitBody)),
        },
        Row {
            name: "2 cacheKey",
            headers: &[],
            body: chat(r#""cacheKey":"camel-k","prefix":"legacy-k""#, &msgs),
            want: Some(("camel-k".into(), KeySource::ExplicitBody)),
        },
        Row {
            name: "3 prefix",
            headers: &[],
            body: chat(r#""prefix":"legacy-k","document_context":"Doc""#, &msgs),
            want: Some(("legacy-k".into(), KeySource::PrefixField)),
        },
        Row {
            name: "4 canonical system+document",
            headers: &[("x-session-id", "s")],
            body: chat(r#""document_context":"Doc""#, &msgs),
            want: Some((canon("You are terse.", "Doc"), KeySource::Canonical)),
        },
        Row {
            name: "4 canonical system only",
            headers: &[],
            body: chat("", &msgs),
            want: Some((canon("You are terse.", ""), KeySource::Canonical)),
        },
        Row {
            name: "4 canonical document only",
            headers: &[],
            body: chat(r#""context":"Doc""#, user),
            want: Some((canon("", "Doc"), KeySource::Canonical)),
        },
        Row {
            name: "5 session header when no context",
            headers: &[("x-session-id", "s")],
            body: chat("", user),
            want: Some(("s".into(), KeySource::SessionHeader)),
        },
        Row {
            name: "5 conversation header",
            headers: &[("x-conversation-id", "c")],
            body: chat("", user),
            want: Some(("c".into(), KeySource::ConversationHeader)),
        },
        Row {
            name: "5 body session_id",
            headers: &[],
            body: chat(r#""session_id":"sb""#, user),
            want: Some(("sb".into(), KeySource::SessionBody)),
        },
        Row {
            name: "5 implicit session",
            headers: &[],
            body: chat("", user),
            want: Some((implicit(&[], "hi"), KeySource::ImplicitSession)),
        },
        Row {
            name: "6 nothing: service fallback",
            headers: &[],
            body: r#"{"model":"m"}"#.into(),
            want: None,
        },
        Row {
            name: "6 no body at all",
            headers: &[],
            body: String::new(),
            want: None,
        },
    ];
    check(Strategy::Prefix, rows);
}

#[test]
fn session_precedence() {
    let user = r#"{"role":"user","content":"hi"}"#;
    let msgs = format!("{SYS},{user}");
    let rows = vec![
        Row {
            name: "1 X-Session-ID",
            headers: &[("x-session-id", "s"), ("x-conversation-id", "c")],
            body: chat(r#""session_id":"b""#, &msgs),
            want: Some(("s".into(), KeySource::SessionHeader)),
        },
        Row {
            name: "2 X-Conversation-ID",
            headers: &[("x-conversation-id", "c")],
            body: chat(r#""session_id":"b""#, &msgs),
            want: Some(("c".into(), KeySource::ConversationHeader)),
        },
        Row {
            name: "3 body session_id",
            headers: &[],
            body: chat(r#""session_id":"b""#, &msgs),
            want: Some(("b".into(), KeySource::SessionBody)),
        },
        Row {
            name: "4 implicit",
            headers: &[],
            body: chat("", &msgs),
            want: Some((
                implicit(&["You are terse."], "hi"),
                KeySource::ImplicitSession,
            )),
        },
        Row {
            name: "blank header falls through",
            headers: &[("x-session-id", "   ")],
            body: chat(r#""session_id":"b""#, &msgs),
            want: Some(("b".into(), KeySource::SessionBody)),
        },
        Row {
            name: "cache key is not a session key",
            headers: &[("x-flexinfer-cache-key", "k")],
            body: r#"{"model":"m"}"#.into(),
            want: None,
        },
        Row {
            name: "no user message: no implicit key",
            headers: &[],
            body: chat("", SYS),
            want: None,
        },
    ];
    check(Strategy::SessionAffinity, rows);
}

#[test]
fn default_and_least_loaded_use_no_key() {
    for s in [Strategy::Default, Strategy::LeastLoaded] {
        let e = run(
            s,
            &[("x-flexinfer-cache-key", "k"), ("x-session-id", "s")],
            r#"{"session_id":"x"}"#,
            &KeyLimits::default(),
        );
        assert_eq!(e.key, None);
    }
}

#[test]
fn implicit_session_is_stable_across_turns() {
    let turns = [
        r#"[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]"#,
        r#"[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]"#,
        r#"[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"},{"role":"assistant","content":"A2"},{"role":"user","content":"Q3"}]"#,
    ];
    let keys: Vec<_> = turns
        .iter()
        .map(|m| {
            run(
                Strategy::SessionAffinity,
                &[],
                &format!(r#"{{"messages":{m}}}"#),
                &KeyLimits::default(),
            )
            .key
            .unwrap()
        })
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    let other = run(
        Strategy::SessionAffinity,
        &[],
        r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Other"}]}"#,
        &KeyLimits::default(),
    )
    .key
    .unwrap();
    assert_ne!(other, keys[0]);
}

#[test]
fn explicit_key_safety_rules() {
    fn ok(s: &str) -> Result<&str, Malformed> {
        validate(s, 128)
    }
    assert_eq!(ok("tenant-a/doc-42"), Ok("tenant-a/doc-42"));
    assert_eq!(ok("  A.b_c:d/e=f-9  "), Ok("A.b_c:d/e=f-9"), "trimmed");
    assert_eq!(ok(""), Err(Malformed::Empty));
    assert_eq!(ok("   "), Err(Malformed::Empty));
    assert_eq!(ok("bad key with spaces 1"), Err(Malformed::BadCharacter));
    assert_eq!(ok("semi;colon"), Err(Malformed::BadCharacter));
    assert_eq!(ok("ünïcode"), Err(Malformed::BadCharacter));
    assert_eq!(ok("a+b"), Err(Malformed::BadCharacter));
    assert_eq!(ok(&"k".repeat(128)), Ok("k".repeat(128).as_str()));
    assert_eq!(
        ok(&"k".repeat(129)),
        Err(Malformed::TooLong { len: 129, max: 128 })
    );
    assert_eq!(
        validate("abcd", 3),
        Err(Malformed::TooLong { len: 4, max: 3 }),
        "max is a knob"
    );
}

#[test]
fn malformed_keys_fall_through_to_the_next_source() {
    let user = r#"{"role":"user","content":"hi"}"#;
    let msgs = format!("{SYS},{user}");
    let limits = KeyLimits::default();
    // Bad header -> valid body cache_key.
    let e = run(
        Strategy::Prefix,
        &[("x-flexinfer-cache-key", "bad key with spaces 0")],
        &chat(r#""cache_key":"good""#, &msgs),
        &limits,
    );
    assert_eq!(
        e.key,
        Some(RoutingKey::new("good", KeySource::ExplicitBody))
    );
    assert_eq!(
        e.ignored,
        vec![Ignored {
            source: KeySource::ExplicitHeader,
            reason: Malformed::BadCharacter
        }]
    );
    // Bad header, bad cache_key, too-long prefix -> canonical context.
    let long = "p".repeat(200);
    let e = run(
        Strategy::Prefix,
        &[("x-flexinfer-cache-key", "bad key")],
        &chat(
            &format!(r#""cache_key":"","prefix":"{long}","document_context":"Doc""#),
            &msgs,
        ),
        &limits,
    );
    assert_eq!(
        e.key,
        Some(RoutingKey::new(
            &canon("You are terse.", "Doc"),
            KeySource::Canonical
        ))
    );
    assert_eq!(e.ignored.len(), 3);
    // A malformed key routes exactly like the same request without it.
    let without = run(
        Strategy::Prefix,
        &[],
        &chat(r#""document_context":"Doc""#, &msgs),
        &limits,
    );
    let with_bad = run(
        Strategy::Prefix,
        &[("x-flexinfer-cache-key", "bad key with spaces 7")],
        &chat(r#""document_context":"Doc""#, &msgs),
        &limits,
    );
    assert_eq!(without.key, with_bad.key);
    // Bad header and nothing else -> no key (service fallback), never an error.
    let e = run(
        Strategy::Prefix,
        &[("x-flexinfer-cache-key", "x y")],
        r#"{"model":"m"}"#,
        &limits,
    );
    assert_eq!(e.key, None);
}

#[test]
fn canonical_normalization_and_segment_cuts() {
    let limits = KeyLimits {
        explicit_key_max_length: 128,
        system_segment_max_length: 5,
        document_segment_max_length: 3,
    };
    let a = run(
        Strategy::Prefix,
        &[],
        r#"{"messages":[{"role":"system","content":"  Hello   world  "}],"document_context":"ABCDEF"}"#,
        &limits,
    );
    assert_eq!(
        a.key,
        Some(RoutingKey::new(
            &canon("Hello", "ABC"),
            KeySource::Canonical
        ))
    );
    // Same first 5 system chars and 3 document chars: same key.
    let b = run(
        Strategy::Prefix,
        &[],
        r#"{"messages":[{"role":"system","content":"Hello there"}],"documents":[{"content":"ABCxyz"}]}"#,
        &limits,
    );
    assert_eq!(a.key, b.key);
    // Parts arrays and plain strings normalize alike.
    let d = KeyLimits::default();
    let s = run(
        Strategy::Prefix,
        &[],
        r#"{"messages":[{"role":"system","content":"Be  brief. Be kind."}]}"#,
        &d,
    );
    let p = run(
        Strategy::Prefix,
        &[],
        r#"{"messages":[{"role":"system","content":[{"type":"text","text":"Be brief."},{"type":"text","text":"Be kind."}]}]}"#,
        &d,
    );
    assert_eq!(s.key, p.key);
    // Multi-byte characters are cut on character boundaries.
    assert_eq!(canonical::cut("ééé", 2), "éé");
}

#[test]
fn canonical_segments_equal_normalizing_everything_then_cutting() {
    // context_text normalizes each text only as far as its cut; the result must be what
    // normalizing whole texts, joining them and cutting gives.
    let h = HeaderMap::new();
    let systems = [
        "  Héllo   wörld ",
        "",
        "   ",
        "second\tsystem  message here",
        "x",
    ];
    let doc = "  a  long\n\n document   with ünïcode  ";
    let messages: Vec<String> = systems
        .iter()
        .map(|s| serde_json::json!({"role": "system", "content": s}).to_string())
        .collect();
    let body = format!(
        r#"{{"model":"m","messages":[{},{{"role":"user","content":"u"}}],"document_context":{}}}"#,
        messages.join(","),
        serde_json::json!(doc)
    );
    let fields = BodyFields::parse(body.as_bytes());
    for sys_max in [1, 2, 5, 11, 12, 13, 20, 40, 512] {
        for doc_max in [1, 3, 9, 256] {
            let limits = KeyLimits {
                explicit_key_max_length: 128,
                system_segment_max_length: sys_max,
                document_segment_max_length: doc_max,
            };
            let joined: Vec<String> = systems
                .iter()
                .map(|s| canonical::normalize(s))
                .filter(|s| !s.is_empty())
                .collect();
            let want = format!(
                "model=m\x1fsystem={}\x1fdocument={}",
                canonical::cut(&joined.join("\n"), sys_max),
                canonical::cut(&canonical::normalize(doc), doc_max)
            );
            let got = canonical::context_text(
                &RequestParts {
                    headers: &h,
                    body: fields.as_ref(),
                    model: Some("m"),
                },
                &limits,
            );
            assert_eq!(got.as_deref(), Some(want.as_str()), "{sys_max} {doc_max}");
        }
    }
}

#[test]
fn canonical_uses_the_routed_model_then_the_body_model() {
    let body = BodyFields::parse(
        br#"{"model":"body-model","messages":[{"role":"system","content":"S"}]}"#,
    );
    let h = HeaderMap::new();
    let limits = KeyLimits::default();
    let routed = canonical::context_text(
        &RequestParts {
            headers: &h,
            body: body.as_ref(),
            model: Some("routed"),
        },
        &limits,
    );
    assert_eq!(
        routed.as_deref(),
        Some("model=routed\x1fsystem=S\x1fdocument=")
    );
    let fallback = canonical::context_text(
        &RequestParts {
            headers: &h,
            body: body.as_ref(),
            model: None,
        },
        &limits,
    );
    assert_eq!(
        fallback.as_deref(),
        Some("model=body-model\x1fsystem=S\x1fdocument=")
    );
}

#[test]
fn completions_prompt_stands_in_for_the_system_segment() {
    let e = run(
        Strategy::Prefix,
        &[],
        r#"{"model":"m","prompt":"Shared   preamble"}"#,
        &KeyLimits::default(),
    );
    assert_eq!(
        e.key,
        Some(RoutingKey::new(
            &canon("Shared preamble", ""),
            KeySource::Canonical
        ))
    );
}

/// `needs_body` must say "read the body" whenever a body could change the key: for every
/// strategy and header set, a key found without the body must equal the key found with a
/// body full of keyed fields.
#[test]
fn needs_body_is_false_only_when_the_body_cannot_change_the_key() {
    let limits = KeyLimits::default();
    let body = r#"{"model":"m","cache_key":"tenant-a","prefix":"p","session_id":"s",
        "messages":[{"role":"system","content":"S"},{"role":"user","content":"u"}]}"#;
    let header_sets: [&[(&str, &str)]; 5] = [
        &[],
        &[("x-session-id", "3")],
        &[("x-conversation-id", "c")],
        &[("x-flexinfer-cache-key", "tenant-h")],
        &[("x-flexinfer-cache-key", "bad key!"), ("x-session-id", "3")],
    ];
    for strategy in Strategy::ALL {
        for hdrs in header_sets {
            if needs_body(strategy, &headers(hdrs), &limits) {
                continue;
            }
            assert_eq!(
                run(strategy, hdrs, "", &limits).key,
                run(strategy, hdrs, body, &limits).key,
                "{strategy:?} {hdrs:?}"
            );
        }
    }
    // The fuzzer's finding: prefix routing with a session header still reads body keys.
    assert!(needs_body(
        Strategy::Prefix,
        &headers(&[("x-session-id", "3")]),
        &limits
    ));
    assert!(!needs_body(
        Strategy::SessionAffinity,
        &headers(&[("x-session-id", "3")]),
        &limits
    ));
}
