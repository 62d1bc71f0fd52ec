//! Span attributes as prost encodes them (OTLP `KeyValue`s), each kept for the next span that
//! carries the same name and value.
//!
//! Why: most of a request span's attributes repeat from one request to the next (the model, the
//! strategy, the key source, the outcome, the pod, the status code, the retry count), and
//! encoding a `KeyValue` costs prost a length pass over it and its value, then a write pass:
//! encoding attributes was three quarters of what exporting a span cost. Copying the bytes
//! prost wrote the last time costs a hash lookup and a copy. Values that seldom repeat (the
//! path as the client sent it, durations other than zero) are encoded every time.
//!
//! Cheapest of all is the attribute a reused span message already holds: when the attribute in
//! a slot is the one written there for the span before, its bytes stay as they are. That holds
//! only while the cache has not started again since (`Held` says when it was written): a shared
//! string's address stays its own only while the cache keeps the string alive.
//!
//! A value is known by identity, not content: a static string by its address, a shared
//! `Arc<str>` by its allocation (the cache holds a clone, so no other string can take that
//! address while the entry lives), integers, booleans and a float of zero by value. The cache
//! is bounded: once it holds `CAPACITY` encodings it starts again empty, so names of pods long
//! gone do not pile up.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;

use super::set_str;
use crate::telemetry::span::{Attribute, Value};

/// Encodings kept at most; past it the cache starts again empty.
pub(super) const CAPACITY: usize = 4096;

/// Writes attributes as encoded `KeyValue`s, from its cache where it can.
#[derive(Debug, Default)]
pub(super) struct AttributeEncoder {
    cache: HashMap<Identity, Encoded, RandomState>,
    /// The message an attribute is written into when prost encodes it afresh, reused.
    scratch: KeyValue,
    /// How many times the cache has started again empty.
    generation: u64,
}

/// What a slot holds: the attribute's identity, written while the cache was in `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    id: Identity,
    generation: u64,
}

/// What an attribute is, for the cache: its name's address and its value's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Identity {
    /// The name's address and length.
    key: (usize, usize),
    value: ValueIdentity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ValueIdentity {
    /// A string's address and length.
    Text(usize, usize),
    Int(i64),
    Bool(bool),
    /// A float of zero (a request that did not queue); no other float is kept.
    Zero,
}

/// An encoded `KeyValue`, and the shared string whose address its identity names.
#[derive(Debug)]
struct Encoded {
    bytes: Box<[u8]>,
    _alive: Option<Arc<str>>,
}

impl AttributeEncoder {
    /// Make `out` hold `a` encoded as an OTLP `KeyValue`. `held` is what `out` holds now
    /// (`None`: unknown), and is set to what it holds after.
    pub(super) fn write(&mut self, a: &Attribute, out: &mut Vec<u8>, held: &mut Option<Held>) {
        let Some(id) = identity(a) else {
            *held = None;
            out.clear();
            self.encode(a, out);
            return;
        };
        if *held == Some(self.held(id)) {
            return;
        }
        out.clear();
        if let Some(known) = self.cache.get(&id) {
            out.extend_from_slice(&known.bytes);
            *held = Some(self.held(id));
            return;
        }
        self.encode(a, out);
        if self.cache.len() >= CAPACITY {
            self.cache.clear();
            self.generation += 1;
        }
        *held = Some(self.held(id));
        let alive = match &a.value {
            Value::Shared(s) => Some(Arc::clone(s)),
            _ => None,
        };
        self.cache.insert(
            id,
            Encoded {
                bytes: out.as_slice().into(),
                _alive: alive,
            },
        );
    }

    fn held(&self, id: Identity) -> Held {
        Held {
            id,
            generation: self.generation,
        }
    }

    /// Encodings held (for tests).
    #[cfg(test)]
    pub(super) fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Encode `a` with prost, through the reused `KeyValue`.
    fn encode(&mut self, a: &Attribute, out: &mut Vec<u8>) {
        let kv = &mut self.scratch;
        if kv.key != a.key {
            set_str(&mut kv.key, a.key);
        }
        let value = &mut kv.value.get_or_insert_with(AnyValue::default).value;
        match &a.value {
            Value::Static(s) => set_string_value(value, s),
            Value::Shared(s) => set_string_value(value, s),
            Value::Owned(s) => set_string_value(value, s),
            Value::Int(n) => *value = Some(any_value::Value::IntValue(*n)),
            Value::Float(x) => *value = Some(any_value::Value::DoubleValue(*x)),
            Value::Bool(b) => *value = Some(any_value::Value::BoolValue(*b)),
        }
        kv.encode(out).expect("a Vec grows to fit the message");
    }
}

/// `a`'s identity, or `None` for values not worth keeping (owned strings, floats but zero).
fn identity(a: &Attribute) -> Option<Identity> {
    let value = match &a.value {
        Value::Static(s) => ValueIdentity::Text(s.as_ptr() as usize, s.len()),
        Value::Shared(s) => ValueIdentity::Text(s.as_ptr() as usize, s.len()),
        Value::Int(n) => ValueIdentity::Int(*n),
        Value::Bool(b) => ValueIdentity::Bool(*b),
        // 0.0 exactly (not -0.0, whose encoding differs).
        Value::Float(x) if x.to_bits() == 0 => ValueIdentity::Zero,
        Value::Owned(_) | Value::Float(_) => return None,
    };
    Some(Identity {
        key: (a.key.as_ptr() as usize, a.key.len()),
        value,
    })
}

fn set_string_value(value: &mut Option<any_value::Value>, s: &str) {
    match value {
        Some(any_value::Value::StringValue(old)) => set_str(old, s),
        _ => *value = Some(any_value::Value::StringValue(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What prost writes for `a` with nothing kept.
    fn fresh(a: &Attribute) -> Vec<u8> {
        let mut out = Vec::new();
        AttributeEncoder::default().encode(a, &mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> (String, Option<any_value::Value>) {
        let kv = KeyValue::decode(bytes).expect("a KeyValue");
        (kv.key, kv.value.and_then(|v| v.value))
    }

    #[test]
    fn every_kind_of_value_is_written_as_prost_encodes_it_whether_kept_or_not() {
        let model: Arc<str> = Arc::from("llama-3-8b");
        let all = [
            Attribute::new("flexinfer.strategy", "prefix"),
            Attribute::new("flexinfer.model", Arc::clone(&model)),
            Attribute::new("url.path", String::from("/v1/completions")),
            Attribute::new("flexinfer.retries", 2i64),
            Attribute::new("flexinfer.ttft_seconds", 0.125),
            Attribute::new("flexinfer.spill", true),
            Attribute::new("flexinfer.queue_wait_seconds", 0.0),
            Attribute::new("flexinfer.queue_wait_seconds", -0.0),
        ];
        let mut e = AttributeEncoder::default();
        let mut out = Vec::new();
        for round in 0..3 {
            for a in &all {
                let mut held = None;
                e.write(a, &mut out, &mut held);
                assert_eq!(out, fresh(a), "round {round}: {a:?}");
            }
        }
        assert_eq!(
            decoded(&out),
            (
                "flexinfer.queue_wait_seconds".into(),
                Some(any_value::Value::DoubleValue(-0.0))
            )
        );
        // strings by address, integers and booleans by value, a float of zero; owned strings
        // and other floats (-0.0 among them: its bits differ) never
        assert_eq!(e.cached(), 5);
    }

    /// The slot keeps its bytes only for the very attribute written there before; any other
    /// name or value in the slot is written again.
    #[test]
    fn a_slot_is_rewritten_unless_it_holds_the_same_attribute() {
        let mut e = AttributeEncoder::default();
        let (mut slot, mut held) = (Vec::new(), None);
        let sequence = [
            Attribute::new("flexinfer.outcome", "hit"),
            Attribute::new("flexinfer.outcome", "hit"),
            Attribute::new("flexinfer.outcome", "miss"),
            Attribute::new("flexinfer.key_source", "miss"),
            Attribute::new("flexinfer.key_source", 3i64),
            Attribute::new("flexinfer.key_source", String::from("owned")),
            Attribute::new("flexinfer.key_source", String::from("owned, again")),
            Attribute::new("flexinfer.key_source", 3i64),
        ];
        for a in &sequence {
            e.write(a, &mut slot, &mut held);
            assert_eq!(slot, fresh(a), "{a:?}");
        }
    }

    /// Two shared strings of the same text are two entries, and a string dropped by the
    /// request path cannot hand its address to another while the cache knows it.
    #[test]
    fn shared_strings_are_known_by_their_allocation_which_the_cache_keeps_alive() {
        let mut e = AttributeEncoder::default();
        let mut out = Vec::new();
        for name in ["pod-a", "pod-b", "pod-a", "pod-c"] {
            let pod: Arc<str> = Arc::from(name);
            let a = Attribute::new("flexinfer.pod", pod);
            e.write(&a, &mut out, &mut None);
            assert_eq!(
                decoded(&out).1,
                Some(any_value::Value::StringValue(name.into()))
            );
        }
        assert_eq!(e.cached(), 4);
    }

    /// After the cache starts again, a slot's bytes are written again even for the attribute it
    /// held: the shared string that attribute named may be gone, its address another's.
    #[test]
    fn a_slot_is_not_trusted_past_a_cache_restart() {
        let mut e = AttributeEncoder::default();
        let pod: Arc<str> = Arc::from("10.0.0.7:8000");
        let a = Attribute::new("flexinfer.pod", Arc::clone(&pod));
        let (mut slot, mut held) = (Vec::new(), None);
        e.write(&a, &mut slot, &mut held);
        assert_eq!(slot, fresh(&a));
        // The slot is trusted as it stands (emptied here to see it).
        slot.clear();
        e.write(&a, &mut slot, &mut held);
        assert!(slot.is_empty());
        let mut other = Vec::new();
        for n in 0..CAPACITY as i64 {
            e.write(
                &Attribute::new("flexinfer.retries", n),
                &mut other,
                &mut None,
            );
        }
        e.write(&a, &mut slot, &mut held);
        assert_eq!(slot, fresh(&a));
    }

    #[test]
    fn the_cache_starts_again_when_full() {
        let mut e = AttributeEncoder::default();
        let mut out = Vec::new();
        for n in 0..(CAPACITY as i64 + 10) {
            let a = Attribute::new("gen_ai.usage.input_tokens", n);
            e.write(&a, &mut out, &mut None);
            assert_eq!(out, fresh(&a));
            assert!(e.cached() <= CAPACITY);
        }
        assert_eq!(e.cached(), 10);
    }
}
