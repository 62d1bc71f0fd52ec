//! Validating field types for the models file.
//!
//! Each value is checked inside the deserializer's visitor rather than after parsing, because
//! only there does serde_yaml_ng attach the line and column of the value being read; a
//! `config check` error (and the proxy's log line) then points at the exact scalar.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::net::SocketAddr;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::discovery::Strategy;

/// A models file that does not parse, and where (1-based), when the parser knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
}

impl From<serde_yaml_ng::Error> for ParseError {
    fn from(e: serde_yaml_ng::Error) -> Self {
        let at = e.location();
        Self {
            message: e.to_string(),
            line: at.as_ref().map(|l| l.line()),
            column: at.as_ref().map(|l| l.column()),
        }
    }
}

/// A scalar parsed and checked inside the deserializer's visitor, where errors get a position.
pub(super) struct Checked<T: FromScalar>(pub(super) T::Out);

impl<T: FromScalar> std::fmt::Debug for Checked<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub(super) trait FromScalar {
    type Out: std::fmt::Debug;
    const EXPECTED: &'static str;
    fn from_scalar(s: &str) -> Result<Self::Out, String>;
}

/// A non-empty model name.
pub(super) struct NonEmpty;

impl FromScalar for NonEmpty {
    type Out = String;
    const EXPECTED: &'static str = "a model name";
    fn from_scalar(s: &str) -> Result<String, String> {
        if s.trim().is_empty() {
            return Err("a model has an empty name".into());
        }
        Ok(s.to_owned())
    }
}

/// An `http://` Service URL.
pub(super) struct HttpUrl;

impl FromScalar for HttpUrl {
    type Out = String;
    const EXPECTED: &'static str = "an http:// URL";
    fn from_scalar(s: &str) -> Result<String, String> {
        if s.starts_with("http://") && s.len() > 7 {
            Ok(s.to_owned())
        } else {
            Err(format!("service {s:?} must be an http:// URL"))
        }
    }
}

impl FromScalar for Strategy {
    type Out = Strategy;
    const EXPECTED: &'static str = "a routing strategy";
    fn from_scalar(s: &str) -> Result<Strategy, String> {
        s.parse()
            .map_err(|e: crate::vocab::UnknownStrategy| e.to_string())
    }
}

impl FromScalar for crate::vocab::EngineKind {
    type Out = crate::vocab::EngineKind;
    const EXPECTED: &'static str = "an engine kind";
    fn from_scalar(s: &str) -> Result<Self::Out, String> {
        s.parse()
            .map_err(|e: crate::vocab::UnknownEngine| e.to_string())
    }
}

/// A model's hash-balance factor (`0` = off, else 1 to 100), in thousandths.
pub(super) struct BalanceFactor;

impl FromScalar for BalanceFactor {
    type Out = u32;
    const EXPECTED: &'static str = "a hash balance factor";
    fn from_scalar(s: &str) -> Result<u32, String> {
        crate::balance::bounded::parse_factor(s).map_err(|e| e.to_string())
    }
}

/// A model's hash-balance floor (requests).
pub(super) struct BalanceFloor;

impl FromScalar for BalanceFloor {
    type Out = u64;
    const EXPECTED: &'static str = "a hash balance floor";
    fn from_scalar(s: &str) -> Result<u64, String> {
        crate::balance::bounded::parse_floor(s).map_err(|e| e.to_string())
    }
}

/// A model's `maxConcurrency` (requests in flight per pod).
pub(super) struct MaxConcurrency;

impl FromScalar for MaxConcurrency {
    type Out = u32;
    const EXPECTED: &'static str = "a number of requests";
    fn from_scalar(s: &str) -> Result<u32, String> {
        crate::admission::settings::parse_max_concurrency(s)
    }
}

/// A model's `queue.maxSize`.
pub(super) struct QueueMaxSize;

impl FromScalar for QueueMaxSize {
    type Out = u32;
    const EXPECTED: &'static str = "a queue size";
    fn from_scalar(s: &str) -> Result<u32, String> {
        crate::admission::settings::parse_queue_max_size(s)
    }
}

/// A model's `queue.timeout` / `queue.sheddableTimeout`.
pub(super) struct QueueTimeout;

impl FromScalar for QueueTimeout {
    type Out = std::time::Duration;
    const EXPECTED: &'static str = "a duration";
    fn from_scalar(s: &str) -> Result<std::time::Duration, String> {
        crate::admission::settings::parse_queue_timeout(s)
    }
}

/// A model's `tokensPerMinute` / `tokenBurst`.
pub(super) struct Tokens;

impl FromScalar for Tokens {
    type Out = u64;
    const EXPECTED: &'static str = "a number of tokens";
    fn from_scalar(s: &str) -> Result<u64, String> {
        crate::admission::settings::parse_tokens(s)
    }
}

/// A tenant id of `queue.tenantWeights`.
pub(super) struct TenantId;

impl FromScalar for TenantId {
    type Out = String;
    const EXPECTED: &'static str = "an x-flexinfer-tenant id";
    fn from_scalar(s: &str) -> Result<String, String> {
        crate::admission::weights::tenant_id(s)
    }
}

/// A tenant's weight in `queue.tenantWeights`.
pub(super) struct Weight;

impl FromScalar for Weight {
    type Out = u32;
    const EXPECTED: &'static str = "a weight";
    fn from_scalar(s: &str) -> Result<u32, String> {
        crate::admission::weights::weight(s)
    }
}

/// `queue.tenantWeights: {tenant: weight, ...}`, each id and weight checked where it is
/// written; the count and duplicates when the mapping ends.
pub(super) struct TenantWeightMap(pub(super) crate::admission::TenantWeights);

impl std::fmt::Debug for TenantWeightMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for TenantWeightMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TenantWeightMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping of tenant ids to weights")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(id) = map.next_key::<Checked<TenantId>>()? {
                    let w = map.next_value::<Checked<Weight>>()?;
                    pairs.push((id.0, w.0));
                }
                crate::admission::TenantWeights::new(pairs)
                    .map(TenantWeightMap)
                    .map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_map(V)
    }
}

impl FromScalar for SocketAddr {
    type Out = SocketAddr;
    const EXPECTED: &'static str = "IP:port";
    fn from_scalar(s: &str) -> Result<SocketAddr, String> {
        s.parse()
            .map_err(|_| format!("endpoint {s:?} is not IP:port"))
    }
}

impl<'de, T: FromScalar> Deserialize<'de> for Checked<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T: FromScalar> Visitor<'_> for V<T> {
            type Value = Checked<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(T::EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                T::from_scalar(s).map(Checked).map_err(E::custom)
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// A list entry whose name must be unique.
pub(super) trait Named {
    fn name(&self) -> &str;
}

/// A list of entries, refusing a name listed twice. The check runs inside each entry's mapping
/// visitor, so the error points at the second entry.
pub(super) fn unique_by_name<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Named,
{
    struct Unique<'a, T>(&'a mut HashSet<String>, PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Named> DeserializeSeed<'de> for Unique<'_, T> {
        type Value = T;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, T: Deserialize<'de> + Named> Visitor<'de> for Unique<'_, T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a mapping with a name")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let m = T::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
            if !self.0.insert(m.name().to_owned()) {
                return Err(serde::de::Error::custom(format!(
                    "model {:?} is listed twice",
                    m.name()
                )));
            }
            Ok(m)
        }
    }
    struct List<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Named> Visitor<'de> for List<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of models")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            while let Some(m) = seq.next_element_seed(Unique(&mut seen, PhantomData))? {
                out.push(m);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(List(PhantomData))
}
