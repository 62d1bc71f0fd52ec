//! Tenant weights (`queue.tenantWeights`): how many turns a tenant takes per round of its
//! priority band, where every tenant not listed takes one.
//!
//! Equal turns give each backlogged tenant the same share of the slots; a tenant that needs
//! more than its share (a chat service next to a batch job) waits without end. A weight gives
//! it that share by name. Names are `x-flexinfer-tenant` ids, validated like the header (the
//! charset of [`crate::keys::explicit::validate`]), and kept only as their hash: the queue
//! looks a tenant up once, when its lane in a band is created, so requests that never queue
//! never read the weights. A tenant known only by its bearer-token hash cannot be named
//! (its label is derived from the hash, and a weight must not need the token).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::tenant::Tenant;
use crate::keys::explicit::{self, Malformed};

/// The most tenants one model may weight.
pub const MAX_TENANT_WEIGHTS: usize = 64;
/// The largest weight.
pub const MAX_WEIGHT: u32 = 100;
/// The weight of a tenant not listed.
pub const DEFAULT_WEIGHT: u32 = 1;
/// The longest tenant id accepted in a weight list (a longer one than the proxy's
/// `explicitKeyMaxLength` never matches a header, which is refused there).
pub const MAX_TENANT_ID_LENGTH: usize = 1024;

/// A model's tenant weights; empty: every tenant takes one turn per round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantWeights(Option<Arc<Table>>);

#[derive(Debug, PartialEq, Eq)]
struct Table {
    by_hash: HashMap<u64, u32>,
    /// The ids as written (trimmed), sorted, for `config check`.
    names: BTreeMap<String, u32>,
}

impl TenantWeights {
    /// Weights from (id, weight) pairs already checked with [`tenant_id`] and [`weight`]: at
    /// most [`MAX_TENANT_WEIGHTS`] of them, each id once.
    pub fn new(pairs: impl IntoIterator<Item = (String, u32)>) -> Result<Self, String> {
        let mut names = BTreeMap::new();
        for (id, w) in pairs {
            if names.insert(id.clone(), w).is_some() {
                return Err(format!("tenant weight {id:?} is listed twice"));
            }
        }
        if names.len() > MAX_TENANT_WEIGHTS {
            return Err(format!(
                "{} tenant weights; at most {MAX_TENANT_WEIGHTS} tenants may be weighted per model",
                names.len()
            ));
        }
        if names.is_empty() {
            return Ok(Self::default());
        }
        let by_hash = names
            .iter()
            .map(|(id, w)| (Tenant::named(id).hash, *w))
            .collect();
        Ok(Self(Some(Arc::new(Table { by_hash, names }))))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The weight of the tenant whose fairness key is `hash`.
    pub fn get(&self, hash: u64) -> u32 {
        self.0
            .as_ref()
            .and_then(|t| t.by_hash.get(&hash).copied())
            .unwrap_or(DEFAULT_WEIGHT)
    }

    /// The weighted tenants, by id.
    pub fn names(&self) -> impl Iterator<Item = (&str, u32)> {
        self.0
            .iter()
            .flat_map(|t| t.names.iter().map(|(id, w)| (id.as_str(), *w)))
    }

    /// `tenant-b 2, tenant-c 3`, or `none`.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        let list: Vec<String> = self.names().map(|(id, w)| format!("{id} {w}")).collect();
        list.join(", ")
    }
}

/// A tenant id of a weight list: an `x-flexinfer-tenant` id, trimmed.
pub fn tenant_id(raw: &str) -> Result<String, String> {
    let id = explicit::validate(raw, MAX_TENANT_ID_LENGTH).map_err(|m| {
        let why = match m {
            Malformed::Empty => "is empty".to_string(),
            Malformed::TooLong { len, max } => format!("has {len} characters, at most {max}"),
            Malformed::BadCharacter => "has a character outside A-Za-z0-9._:/=-".to_string(),
        };
        format!("tenant {raw:?} {why} (an x-flexinfer-tenant id)")
    })?;
    if id.starts_with("bearer:") {
        return Err(format!(
            "tenant {id:?}: a tenant known by its bearer token cannot be weighted; give it an x-flexinfer-tenant id"
        ));
    }
    Ok(id.to_owned())
}

/// A tenant's weight: turns per round, 1 to [`MAX_WEIGHT`].
pub fn weight(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(w) if (1..=MAX_WEIGHT).contains(&w) => Ok(w),
        _ => Err(format!(
            "tenant weight {s:?} must be a whole number of turns from 1 to {MAX_WEIGHT}"
        )),
    }
}

/// The annotation's spelling, `tenant-b=2,tenant-c=3` (white space around each part allowed).
pub fn parse_list(s: &str) -> Result<TenantWeights, String> {
    let pairs = s
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (id, w) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not tenant=weight"))?;
            Ok((tenant_id(id)?, weight(w)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    TenantWeights::new(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_tenants_take_their_weight_and_the_rest_one() {
        let w = TenantWeights::new([("tenant-b".into(), 2), ("c".into(), 100)]).unwrap();
        assert_eq!(w.get(Tenant::named("tenant-b").hash), 2);
        assert_eq!(w.get(Tenant::named("c").hash), 100);
        assert_eq!(w.get(Tenant::named("tenant-a").hash), 1);
        assert_eq!(w.get(Tenant::SHARED.hash), 1);
        // A bearer token spelled like the id is another tenant.
        assert_eq!(w.get(Tenant::bearer(b"tenant-b").hash), 1);
        assert_eq!(w.describe(), "c 100, tenant-b 2");
        assert_eq!(TenantWeights::default().describe(), "none");
        assert!(TenantWeights::new([]).unwrap().is_empty());
    }

    #[test]
    fn ids_weights_and_counts_are_bounded() {
        assert_eq!(tenant_id(" team-a ").unwrap(), "team-a");
        for bad in ["", "team a", "café", "bearer:0123abcd"] {
            assert!(tenant_id(bad).is_err(), "{bad}");
        }
        assert!(tenant_id(&"a".repeat(MAX_TENANT_ID_LENGTH + 1)).is_err());
        assert_eq!((weight("1"), weight(" 100 ")), (Ok(1), Ok(100)));
        for bad in ["0", "101", "-1", "1.5", "two"] {
            assert!(weight(bad).is_err(), "{bad}");
        }
        let many = |n: usize| (0..n).map(|i| (format!("t{i}"), 1));
        assert!(TenantWeights::new(many(MAX_TENANT_WEIGHTS)).is_ok());
        let e = TenantWeights::new(many(MAX_TENANT_WEIGHTS + 1)).unwrap_err();
        assert!(e.contains("at most 64"), "{e}");
        let e = TenantWeights::new([("a".into(), 1), ("a".into(), 2)]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn the_annotation_list_parses_whole_or_not_at_all() {
        let w = parse_list("tenant-b=2, c = 3,").unwrap();
        assert_eq!(w.describe(), "c 3, tenant-b 2");
        assert!(parse_list("").unwrap().is_empty());
        for bad in ["b", "b=0", "b=2,c", "bearer:1=2", "a=1,a=2"] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }
}
