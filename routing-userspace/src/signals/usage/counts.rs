//! The token counts of one captured `usage` or `timings` object, read in one pass over its
//! bytes into fixed fields: no `serde_json::Value` tree (with a map and a string per key) is
//! built for an answer whose only interesting parts are a few integers.
//!
//! The rules are those of reading a parsed JSON value: the object must be valid JSON; a
//! repeated key takes its last value; a count is a whole, non-negative number no larger than
//! [`MAX_TOKENS`] (a float, a string, a negative number or an absurd one is no count); a
//! `*_details` field that is not an object holds no count.

use serde::de::{Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// Token counts past this are nonsense.
pub(super) const MAX_TOKENS: u64 = 1 << 40;

/// The counts an engine may put in `usage` (OpenAI, vLLM, the Responses API) or `timings`
/// (llama.cpp); each `None` when absent or not a count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens`.
    pub prompt_cached: Option<u64>,
    /// `input_tokens_details.cached_tokens`.
    pub input_cached: Option<u64>,
    /// `cached_tokens` (read inside a `*_details` object).
    pub cached_tokens: Option<u64>,
    pub cache_n: Option<u64>,
    pub prompt_n: Option<u64>,
    pub predicted_n: Option<u64>,
}

impl Counts {
    /// The counts of a JSON object, or `None` when `bytes` is not one.
    pub(super) fn parse(bytes: &[u8]) -> Option<Counts> {
        if bytes.is_empty() {
            return None;
        }
        // Checked as UTF-8 once, whole: read from a `str`, serde_json checks no key or string
        // again (from bytes it checked each, about 400 instructions for a three-key `usage`).
        // Bytes that are not UTF-8 are no JSON either way.
        let text = std::str::from_utf8(bytes).ok()?;
        match serde_json::from_str::<Item>(text).ok()? {
            Item::Object(c) => Some(c),
            Item::Count(_) | Item::Other => None,
        }
    }

    fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Counts, A::Error> {
        let mut c = Counts::default();
        while let Some(field) = map.next_key::<Field>()? {
            let item = map.next_value::<Item>()?;
            let count = item.count();
            match field {
                Field::PromptTokens => c.prompt_tokens = count,
                Field::CompletionTokens => c.completion_tokens = count,
                Field::InputTokens => c.input_tokens = count,
                Field::OutputTokens => c.output_tokens = count,
                Field::CachedTokens => c.cached_tokens = count,
                Field::PromptTokensDetails => c.prompt_cached = item.cached(),
                Field::InputTokensDetails => c.input_cached = item.cached(),
                Field::CacheN => c.cache_n = count,
                Field::PromptN => c.prompt_n = count,
                Field::PredictedN => c.predicted_n = count,
                Field::Other => {}
            }
        }
        Ok(c)
    }
}

/// The keys that are read; any other is skipped.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    PromptTokens,
    CompletionTokens,
    InputTokens,
    OutputTokens,
    CachedTokens,
    PromptTokensDetails,
    InputTokensDetails,
    CacheN,
    PromptN,
    PredictedN,
    #[serde(other)]
    Other,
}

/// Any JSON value, as far as counting reads it.
enum Item {
    Count(u64),
    Object(Counts),
    Other,
}

impl Item {
    fn count(&self) -> Option<u64> {
        match *self {
            Item::Count(n) => Some(n),
            _ => None,
        }
    }

    /// The `cached_tokens` of a details object.
    fn cached(&self) -> Option<u64> {
        match self {
            Item::Object(c) => c.cached_tokens,
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor)
    }
}

struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_u64<E: Error>(self, n: u64) -> Result<Item, E> {
        Ok(match n <= MAX_TOKENS {
            true => Item::Count(n),
            false => Item::Other,
        })
    }

    fn visit_i64<E: Error>(self, n: i64) -> Result<Item, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Ok(Item::Other),
        }
    }

    fn visit_f64<E: Error>(self, _: f64) -> Result<Item, E> {
        Ok(Item::Other)
    }

    fn visit_bool<E: Error>(self, _: bool) -> Result<Item, E> {
        Ok(Item::Other)
    }

    fn visit_str<E: Error>(self, _: &str) -> Result<Item, E> {
        Ok(Item::Other)
    }

    fn visit_unit<E: Error>(self) -> Result<Item, E> {
        Ok(Item::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Item::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
        Counts::read(map).map(Item::Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Option<Counts> {
        Counts::parse(s.as_bytes())
    }

    #[test]
    fn reads_each_engines_fields() {
        let c = parse(
            r#"{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,
                "prompt_tokens_details":{"cached_tokens":8,"audio_tokens":0}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.prompt_tokens, c.completion_tokens, c.prompt_cached),
            (Some(12), Some(5), Some(8))
        );
        let c = parse(
            r#"{"input_tokens":3,"output_tokens":4,"input_tokens_details":{"cached_tokens":2}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.input_tokens, c.output_tokens, c.input_cached),
            (Some(3), Some(4), Some(2))
        );
        let c =
            parse(r#"{"cache_n":7,"prompt_n":3,"predicted_n":9,"prompt_ms":1.5,"x":[1,{"a":2}]}"#)
                .unwrap();
        assert_eq!(
            (c.cache_n, c.prompt_n, c.predicted_n),
            (Some(7), Some(3), Some(9))
        );
    }

    #[test]
    fn what_is_not_a_count_is_none() {
        for body in [
            r#"{"prompt_tokens":10.5}"#,
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":"8"}"#,
            r#"{"prompt_tokens":null}"#,
            r#"{"prompt_tokens":true}"#,
            r#"{"prompt_tokens":[1]}"#,
            r#"{"prompt_tokens":{"cached_tokens":1}}"#,
            r#"{"prompt_tokens":1e300}"#,
            r#"{"prompt_tokens":99999999999999999999}"#,
            r#"{"prompt_tokens":2000000000000}"#,
        ] {
            assert_eq!(parse(body).unwrap().prompt_tokens, None, "{body}");
        }
        // A details field that is not an object, or holds no count, gives none.
        for body in [
            r#"{"prompt_tokens_details":5}"#,
            r#"{"prompt_tokens_details":[{"cached_tokens":5}]}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":"5"}}"#,
        ] {
            assert_eq!(parse(body).unwrap().prompt_cached, None, "{body}");
        }
        // `cached_tokens` counts only inside the details.
        assert_eq!(parse(r#"{"cached_tokens":5}"#).unwrap().prompt_cached, None);
    }

    #[test]
    fn the_last_of_a_repeated_key_wins_and_escaped_keys_match() {
        let c = parse(r#"{"prompt_tokens":1,"prompt_tokens":2}"#).unwrap();
        assert_eq!(c.prompt_tokens, Some(2));
        let c = parse(r#"{"prompt_tokens":1,"prompt_tokens":"x"}"#).unwrap();
        assert_eq!(c.prompt_tokens, None);
        let c = parse(r#"{"prompt\u005ftokens":4}"#).unwrap();
        assert_eq!(c.prompt_tokens, Some(4));
    }

    #[test]
    fn broken_truncated_or_not_an_object_is_none() {
        for body in [
            "",
            "{",
            r#"{"prompt_tokens":3"#,
            r#"{"prompt_tokens":3]]}"#,
            r#"{"prompt_tokens":3} trailing"#,
            "[1,2]",
            "7",
            r#""usage""#,
            "null",
        ] {
            assert_eq!(parse(body), None, "{body}");
        }
    }

    #[test]
    fn deep_nesting_never_overflows_the_stack() {
        // Arrays are skipped without recursing: the counts beside them are still read.
        let arrays = format!(
            r#"{{"prompt_tokens":2,"x":{}1{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(parse(&arrays).unwrap().prompt_tokens, Some(2));
        // Objects are read, so serde_json's depth limit ends a deep one: no counts at all.
        let objects = format!(
            r#"{{"prompt_tokens":2,"x":{}1{}}}"#,
            r#"{"a":"#.repeat(10_000),
            "}".repeat(10_000)
        );
        assert_eq!(parse(&objects), None);
    }

    #[test]
    fn a_count_is_what_a_json_reader_calls_an_unsigned_integer() {
        for (body, want) in [
            (r#"{"prompt_tokens":0}"#, Some(0)),
            (r#"{"prompt_tokens":-0}"#, None),
            (r#"{"prompt_tokens":1E2}"#, None),
            (r#"{"prompt_tokens":1.0}"#, None),
            (r#"{"prompt_tokens": 7 }"#, Some(7)),
            (r#"{"prompt_tokens":1099511627776}"#, Some(MAX_TOKENS)),
        ] {
            assert_eq!(parse(body).unwrap().prompt_tokens, want, "{body}");
        }
        // Within a details object, the same.
        let c = parse(r#"{"prompt_tokens_details":{"cached_tokens":3,"cached_tokens":4}}"#);
        assert_eq!(c.unwrap().prompt_cached, Some(4));
    }

    /// What a JSON value reader makes of the same object (`serde_json::Value`: the last of a
    /// repeated key, escapes decoded, `-0` and `1.0` floats).
    fn reference(text: &str) -> Option<Counts> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let object = value.as_object()?;
        let n = |k: &str| {
            object
                .get(k)
                .and_then(serde_json::Value::as_u64)
                .filter(|&n| n <= MAX_TOKENS)
        };
        let cached = |k: &str| {
            object
                .get(k)?
                .as_object()?
                .get("cached_tokens")?
                .as_u64()
                .filter(|&n| n <= MAX_TOKENS)
        };
        Some(Counts {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
            input_tokens: n("input_tokens"),
            output_tokens: n("output_tokens"),
            prompt_cached: cached("prompt_tokens_details"),
            input_cached: cached("input_tokens_details"),
            cached_tokens: n("cached_tokens"),
            cache_n: n("cache_n"),
            prompt_n: n("prompt_n"),
            predicted_n: n("predicted_n"),
        })
    }

    proptest::proptest! {
        #[test]
        fn reads_as_a_json_value_reader_does(
            members in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        r#""prompt_tokens""#, r#""completion_tokens""#, r#""input_tokens""#,
                        r#""output_tokens""#, r#""cached_tokens""#, r#""cache_n""#,
                        r#""prompt_n""#, r#""predicted_n""#, r#""prompt_tokens_details""#,
                        r#""input_tokens_details""#, r#""prompt\u005ftokens""#, r#""other""#,
                    ]),
                    proptest::sample::select(vec![
                        "0", "7", "-0", "-3", "1.0", "2e3", "1099511627776", "1099511627777",
                        "18446744073709551616", r#""5""#, "null", "true", "[1,2]",
                        r#"{"cached_tokens":4}"#, r#"{"cached_tokens":4.5}"#,
                        r#"{"cached_tokens":1,"cached_tokens":2}"#, r#"{"x":{"cached_tokens":9}}"#,
                    ]),
                ),
                0..8,
            ),
            broken in proptest::bool::weighted(0.1),
        ) {
            let mut text = String::from("{");
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&format!("{k}:{v}"));
            }
            if !broken {
                text.push('}');
            }
            proptest::prop_assert_eq!(parse(&text), reference(&text), "{}", text);
        }
    }
}
