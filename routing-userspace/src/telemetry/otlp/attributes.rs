//! Span attributes as prost encodes them (OTLP `KeyValue`s, each framed as the `Span`'s
//! field 9), kept for the next span that carries the same ones.
//!
//! Why: most of a request span's attributes repeat from one request to the next (the model, the
//! strategy, the key source, the outcome, the pod, the status code, the retry count), and
//! encoding a `KeyValue` costs prost a length pass over it and its value, then a write pass:
//! encoding attributes was most of what exporting a span cost. So the attributes a span takes
//! from small sets ([`Attributes::split`]) are kept together as one block, found by one hash of
//! all their identities and copied whole; a measured number (a duration, a token count) is
//! written over its name's kept encoding, since its value seldom repeats.
//!
//! A value is known by identity, not content: a static string by its address, a shared
//! `Arc<str>` by its allocation (the cache clones the `Arc` when it keeps an encoding, so no
//! other string can take that address while the entry lives), integers and booleans by value. A
//! measured float is written from its name's encoding with the value 0.0, its eight bytes then
//! overwritten (a double is fixed-width and last); a measured integer from its name's encoding
//! with a value whose varint is as long as its own, then its varint over the end. Any other
//! string has no identity and is encoded every time, after the block.
//!
//! Both caches are bounded ([`super::kept`]), so names of pods long gone do not pile up.

use std::sync::Arc;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::encoding::{encode_varint, encoded_len_varint};

use super::kept::Kept;
use super::set_str;
use crate::telemetry::span::{Attribute, Attributes, Identity, Value, FLOAT_NAME, INT_NAME};

/// `Span.attributes`.
const ATTRIBUTES_FIELD: u32 = 9;

/// Writes attributes as encoded `Span.attributes` fields, from its cache where it can.
#[derive(Debug, Default)]
pub(super) struct AttributeEncoder {
    /// The attributes from small sets of a span with an identity, encoded together, by all
    /// their identities.
    blocks: Kept,
    /// Measured attributes with an identity, one by one; a float's entry is its name with the
    /// value 0.0, whose last eight bytes are the value.
    single: Kept,
    /// The message an attribute is written into when prost encodes it afresh, reused.
    scratch: KeyValue,
}

/// Fold `word` into the hash `h` (a multiply carries every bit of it into the high bits).
fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl AttributeEncoder {
    /// Append `attributes` to `out` as `Span.attributes` fields: those from small sets with an
    /// identity first (one block), then the rest in order.
    pub(super) fn write(&mut self, attributes: &Attributes<'_>, out: &mut Vec<u8>) {
        let (of_small_sets, measured) = attributes.split();
        if self.write_block(of_small_sets, out) < of_small_sets.len() {
            for a in of_small_sets.iter().filter(|a| a.identity().is_none()) {
                self.write_single(a, out);
            }
        }
        for a in measured {
            self.write_single(a, out);
        }
    }

    /// The attributes of `list` that have an identity, as one block; how many there were.
    fn write_block(&mut self, list: &[Attribute<'_>], out: &mut Vec<u8>) -> usize {
        let (mut h, mut n) = (0, 0);
        for id in list.iter().filter_map(Attribute::identity) {
            h = mix(h, fold(&id));
            n += 1;
        }
        if n == 0 {
            return 0;
        }
        if let Some(bytes) = self
            .blocks
            .get(h, |id| id.len() == 4 * n && same_identities(list, id))
        {
            out.extend_from_slice(bytes);
            return n;
        }
        let start = out.len();
        let mut id = Vec::with_capacity(4 * n);
        let mut alive = Vec::new();
        for a in list {
            if let Some(i) = a.identity() {
                self.encode(a, out);
                id.extend_from_slice(&i);
                alive.extend(shared(a));
            }
        }
        self.blocks.put(h, &id, &out[start..], alive);
        n
    }

    /// One attribute: a number over its name's kept encoding, anything else with an identity
    /// from the cache.
    ///
    /// A measured integer (a token count) seldom repeats, so it is not kept by value: its
    /// name's encoding with a value of the same varint length is, and the value's varint is
    /// written over the end (an integer is the last field of the value, the value the last of
    /// the `KeyValue`). A float likewise, over a value of 0.0 (a double is fixed-width).
    fn write_single(&mut self, a: &Attribute<'_>, out: &mut Vec<u8>) {
        let (id, number) = match (a.value(), a.identity()) {
            (Value::Int(n), _) => {
                let len = encoded_len_varint(n as u64);
                (number_template(a.key(), INT_NAME, len), Some(Value::Int(n)))
            }
            (Value::Float(x), _) => (
                number_template(a.key(), FLOAT_NAME, 8),
                Some(Value::Float(x)),
            ),
            (_, Some(id)) => (id, None),
            (_, None) => return self.encode(a, out),
        };
        let h = mix(0, fold(&id));
        if let Some(bytes) = self.single.get(h, |kept| kept == id) {
            out.extend_from_slice(bytes);
        } else {
            let start = out.len();
            match number {
                Some(Value::Int(n)) => {
                    let template = of_varint_len(encoded_len_varint(n as u64));
                    self.encode(&Attribute::new(a.key(), template), out)
                }
                Some(_) => self.encode(&Attribute::new(a.key(), 0.0), out),
                None => self.encode(a, out),
            }
            let alive = shared(a).into_iter().collect();
            self.single.put(h, &id, &out[start..], alive);
        }
        let end = out.len();
        match number {
            Some(Value::Int(n)) => {
                let len = encoded_len_varint(n as u64);
                encode_varint(n as u64, &mut &mut out[end - len..]);
            }
            // fixed64, little-endian
            Some(Value::Float(x)) => out[end - 8..].copy_from_slice(&x.to_le_bytes()),
            _ => {}
        }
    }

    /// Encodings held (for tests).
    #[cfg(test)]
    pub(super) fn cached(&self) -> usize {
        self.blocks.len() + self.single.len()
    }

    /// Append `a` as prost encodes it, through the reused `KeyValue`.
    fn encode(&mut self, a: &Attribute<'_>, out: &mut Vec<u8>) {
        let kv = &mut self.scratch;
        if kv.key != a.key() {
            set_str(&mut kv.key, a.key());
        }
        let value = &mut kv.value.get_or_insert_with(AnyValue::default).value;
        match a.value() {
            Value::Static(s) => set_string_value(value, s),
            Value::Shared(s) => set_string_value(value, s),
            Value::Text(s) => set_string_value(value, s),
            Value::Int(n) => *value = Some(any_value::Value::IntValue(n)),
            Value::Float(x) => *value = Some(any_value::Value::DoubleValue(x)),
            Value::Bool(b) => *value = Some(any_value::Value::BoolValue(b)),
        }
        prost::encoding::message::encode(ATTRIBUTES_FIELD, &*kv, out);
    }
}

/// The identities of the attributes of `list` that have one are `kept` (as many, checked by
/// the caller), in order.
fn same_identities(list: &[Attribute<'_>], kept: &[u64]) -> bool {
    let mut i = 0;
    for id in list.iter().filter_map(Attribute::identity) {
        if kept[i..i + 4] != id {
            return false;
        }
        i += 4;
    }
    true
}

/// The identity of the kept encoding of a number attribute named `key` whatever its value:
/// `kind` (a float or an integer) and the length of the value's encoding.
fn number_template(key: &'static str, kind: u64, len: usize) -> Identity {
    [key.as_ptr() as u64, key.len() as u64, len as u64, kind]
}

/// The smallest integer whose varint takes `len` bytes (1 to 10); a negative `int64` takes ten.
fn of_varint_len(len: usize) -> i64 {
    match len {
        1 => 0,
        2..=9 => 1i64 << (7 * (len - 1)),
        _ => i64::MIN,
    }
}

/// An identity in one word, for the hash.
fn fold(id: &[u64]) -> u64 {
    id[0] ^ id[1].rotate_left(48) ^ id[2].rotate_left(17) ^ id[3]
}

/// The shared string `a` names, which a kept encoding must keep alive.
fn shared(a: &Attribute<'_>) -> Option<Arc<str>> {
    match a.value() {
        Value::Shared(s) => Some(Arc::clone(s)),
        _ => None,
    }
}

fn set_string_value(value: &mut Option<any_value::Value>, s: &str) {
    match value {
        Some(any_value::Value::StringValue(old)) => set_str(old, s),
        _ => *value = Some(any_value::Value::StringValue(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::Span;
    use prost::Message;

    use super::*;
    use crate::telemetry::otlp::kept::ENTRIES;

    /// What prost writes for `a` as a `Span.attributes` field, built without the encoder.
    fn fresh(a: &Attribute<'_>) -> Vec<u8> {
        let value = match a.value() {
            Value::Static(s) => any_value::Value::StringValue((*s).to_owned()),
            Value::Shared(s) => any_value::Value::StringValue(s.to_string()),
            Value::Text(s) => any_value::Value::StringValue(s.to_owned()),
            Value::Int(n) => any_value::Value::IntValue(n),
            Value::Float(x) => any_value::Value::DoubleValue(x),
            Value::Bool(b) => any_value::Value::BoolValue(b),
        };
        let span = Span {
            attributes: vec![KeyValue {
                key: a.key().to_owned(),
                value: Some(AnyValue { value: Some(value) }),
                ..Default::default()
            }],
            ..Default::default()
        };
        span.encode_to_vec()
    }

    fn fresh_all<'a, 'v: 'a>(list: impl IntoIterator<Item = &'a Attribute<'v>>) -> Vec<u8> {
        list.into_iter().flat_map(fresh).collect()
    }

    fn written(e: &mut AttributeEncoder, a: &Attributes<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        e.write(a, &mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Vec<(String, Option<any_value::Value>)> {
        let span = Span::decode(bytes).expect("Span.attributes fields");
        span.attributes
            .into_iter()
            .map(|kv| (kv.key, kv.value.and_then(|v| v.value)))
            .collect()
    }

    #[test]
    fn every_kind_of_value_is_written_as_prost_encodes_it_whether_kept_or_not() {
        let model: Arc<str> = Arc::from("llama-3-8b");
        let all = [
            Attribute::new("flexinfer.strategy", "prefix"),
            Attribute::new("flexinfer.model", &model),
            Attribute::new("url.path", Value::Text("/v1/completions")),
            Attribute::new("flexinfer.retries", 2i64),
            Attribute::new("flexinfer.ttft_seconds", 0.125),
            Attribute::new("flexinfer.spill", true),
            Attribute::new("flexinfer.queue_wait_seconds", 0.0),
            Attribute::new("flexinfer.queue_wait_seconds", -0.0),
        ];
        let mut e = AttributeEncoder::default();
        for round in 0..3 {
            for a in &all {
                let mut alone = Attributes::default();
                alone.set(a.key(), a.value());
                assert_eq!(written(&mut e, &alone), fresh(a), "round {round}: {a:?}");
                let mut measured = Attributes::default();
                measured.measured(a.key(), a.value());
                assert_eq!(written(&mut e, &measured), fresh(a), "round {round}: {a:?}");
            }
        }
        assert_eq!(
            decoded(&fresh(&all[7])),
            vec![(
                "flexinfer.queue_wait_seconds".into(),
                Some(any_value::Value::DoubleValue(-0.0))
            )]
        );
        // strings by address, integers and booleans by value, each once as a block and once
        // alone; a float once per name; owned strings never (unless two met in a slot)
        assert!(e.cached() <= 10, "{}", e.cached());
    }

    /// The attributes from small sets that have an identity come first, as one block, then
    /// those without one, then the measured ones, each group in its order.
    #[test]
    fn the_block_comes_first_then_the_rest_in_order() {
        let pod: Arc<str> = Arc::from("10.0.0.7:8000");
        let mut a = Attributes::default();
        a.measured("flexinfer.ttft_seconds", 0.5);
        a.set("flexinfer.strategy", "prefix");
        a.set("url.path", Value::Text("/custom"));
        a.measured("gen_ai.usage.input_tokens", 12i64);
        a.set("flexinfer.pod", &pod);
        let (small, measured) = a.split();
        assert_eq!(small.len(), 3);
        assert_eq!(measured.len(), 2);
        let mut e = AttributeEncoder::default();
        for _ in 0..2 {
            let keys: Vec<String> = decoded(&written(&mut e, &a))
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(
                keys,
                [
                    "flexinfer.strategy",
                    "flexinfer.pod",
                    "url.path",
                    "flexinfer.ttft_seconds",
                    "gen_ai.usage.input_tokens"
                ]
            );
        }
    }

    /// A block is copied only for the very same attributes in the same order: any other name,
    /// value or order is a block of its own, written as prost would.
    #[test]
    fn a_block_is_reused_only_for_the_same_attributes() {
        let pods: Vec<Arc<str>> = ["pod-a", "pod-a", "pod-b"].map(Arc::from).into();
        let sets: Vec<Vec<Attribute>> = vec![
            vec![
                Attribute::new("flexinfer.outcome", "hit"),
                Attribute::new("flexinfer.retries", 0i64),
            ],
            vec![
                Attribute::new("flexinfer.outcome", "hit"),
                Attribute::new("flexinfer.retries", 1i64),
            ],
            vec![
                Attribute::new("flexinfer.retries", 0i64),
                Attribute::new("flexinfer.outcome", "hit"),
            ],
            vec![
                Attribute::new("flexinfer.outcome", "miss"),
                Attribute::new("flexinfer.retries", 0i64),
            ],
            vec![
                Attribute::new("flexinfer.key_source", "hit"),
                Attribute::new("flexinfer.retries", 0i64),
            ],
            vec![
                Attribute::new("flexinfer.outcome", "hit"),
                Attribute::new("flexinfer.retries", 0i64),
                Attribute::new("flexinfer.spill", false),
            ],
            vec![Attribute::new("flexinfer.pod", &pods[0])],
            vec![Attribute::new("flexinfer.pod", &pods[1])],
            vec![Attribute::new("flexinfer.pod", &pods[2])],
        ];
        let mut e = AttributeEncoder::default();
        for round in 0..2 {
            for set in &sets {
                let out = written(&mut e, &Attributes::from(set.clone()));
                assert_eq!(out, fresh_all(set), "round {round}: {set:?}");
            }
        }
        // two strings of the same text are two allocations, two blocks (unless two met in a
        // slot)
        assert!(e.cached() <= sets.len(), "{}", e.cached());
    }

    /// A float written over its name's encoding is what prost writes for it, whatever it is.
    #[test]
    fn a_float_is_its_names_encoding_with_its_own_eight_bytes() {
        let mut e = AttributeEncoder::default();
        let specials = [
            0.0,
            -0.0,
            1.0,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e300,
            -2.5e-300,
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let generated = (0..200).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f64::from_bits(x)
        });
        for (i, v) in specials.into_iter().chain(generated).enumerate() {
            let key = ["flexinfer.ttft_seconds", "flexinfer.queue_wait_seconds"][i % 2];
            let mut a = Attributes::default();
            a.measured(key, v);
            a.set("flexinfer.outcome", "hit");
            a.set("flexinfer.label", Value::Text("x"));
            let expected = fresh_all([
                &Attribute::new("flexinfer.outcome", "hit"),
                &Attribute::new("flexinfer.label", Value::Text("x")),
                &Attribute::new(key, v),
            ]);
            assert_eq!(written(&mut e, &a), expected, "{v:e} ({:#x})", v.to_bits());
        }
    }

    /// An integer written over its name's encoding is what prost writes for it, whatever
    /// its varint's length, and each name keeps one encoding per length, not per value.
    #[test]
    fn a_measured_integer_is_its_names_encoding_with_its_own_varint() {
        let mut e = AttributeEncoder::default();
        let specials = [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            -1,
            i64::MIN,
            i64::MAX,
            1 << 62,
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let generated = (0..300).map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // every varint length, small ones most often
            (x >> (i % 64)) as i64
        });
        for (i, v) in specials.into_iter().chain(generated).enumerate() {
            let key = ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"][i % 2];
            let mut a = Attributes::default();
            a.measured(key, v);
            a.set("flexinfer.outcome", "hit");
            let expected = fresh_all([
                &Attribute::new("flexinfer.outcome", "hit"),
                &Attribute::new(key, v),
            ]);
            assert_eq!(written(&mut e, &a), expected, "{v}");
        }
        // one block, and at most ten lengths for each of the two names
        assert!(e.cached() <= 1 + 2 * 10, "{}", e.cached());
    }

    /// Entries that meet in a slot take it from each other, and what is written is always
    /// right; the cache never holds more than its slots.
    #[test]
    fn the_cache_holds_no_more_than_its_slots() {
        let mut e = AttributeEncoder::default();
        for round in 0..2 {
            for n in 0..(4 * ENTRIES as i64) {
                let mut a = Attributes::default();
                a.measured("gen_ai.usage.input_tokens", n);
                a.set("flexinfer.retries", n);
                a.set("flexinfer.spill", n % 2 == 0);
                let expected = fresh_all([
                    &Attribute::new("flexinfer.retries", n),
                    &Attribute::new("flexinfer.spill", n % 2 == 0),
                    &Attribute::new("gen_ai.usage.input_tokens", n),
                ]);
                assert_eq!(written(&mut e, &a), expected, "round {round}, {n}");
                assert!(e.cached() <= 2 * ENTRIES);
            }
        }
        assert!(e.cached() > ENTRIES, "most slots in use: {}", e.cached());
    }
}
