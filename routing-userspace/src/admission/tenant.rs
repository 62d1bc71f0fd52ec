//! The fairness key: who a queued request belongs to.
//!
//! `x-flexinfer-tenant: <id>` first, validated exactly like an explicit cache key
//! ([`crate::keys::explicit::validate`]: trimmed, 1..=`explicitKeyMaxLength` characters of
//! `A-Za-z0-9._:/=-`); a malformed one is skipped and reported. Else the `Authorization: Bearer`
//! token, of which only a 64-bit hash is kept (the token is never stored, logged or exported;
//! its metric label is derived from the hash). Else every request shares one tenant.
//!
//! Only hashes travel into the queue; the header id is borrowed from the request for the
//! tenant's metric label, which the caller resolves once per tenant.

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName};

use crate::header_lookup::header;
use crate::keys::explicit::{self, Malformed};
use crate::keys::KeyLimits;

pub const HEADER_TENANT: HeaderName = HeaderName::from_static("x-flexinfer-tenant");

/// Seeds keep the header id `abc` and the bearer token `abc` apart.
const HEADER_SEED: u64 = 0x7465_6e61_6e74_0001;
const BEARER_SEED: u64 = 0x7465_6e61_6e74_0002;

/// Where a tenant came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TenantSource {
    /// `x-flexinfer-tenant`.
    Header,
    /// A hash of the `Authorization: Bearer` token.
    Bearer,
    /// Neither: the one shared tenant.
    Shared,
}

impl TenantSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantSource::Header => "header",
            TenantSource::Bearer => "bearer",
            TenantSource::Shared => "shared",
        }
    }
}

/// One request's tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant<'h> {
    /// The fairness key.
    pub hash: u64,
    pub source: TenantSource,
    /// The validated header id, for the metric label (never a token).
    id: Option<&'h str>,
}

/// The label of the shared tenant.
pub const SHARED_LABEL: &str = "shared";

impl Tenant<'static> {
    /// The tenant of requests that name none.
    pub const SHARED: Tenant<'static> = Tenant {
        hash: 0,
        source: TenantSource::Shared,
        id: None,
    };
}

impl<'h> Tenant<'h> {
    /// A tenant named by `x-flexinfer-tenant` (the id already validated).
    pub fn named(id: &'h str) -> Self {
        Self {
            hash: xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), HEADER_SEED),
            source: TenantSource::Header,
            id: Some(id),
        }
    }

    /// A tenant known by its bearer token (only the hash is kept).
    pub fn bearer(token: &[u8]) -> Self {
        Self {
            hash: xxhash_rust::xxh3::xxh3_64_with_seed(token, BEARER_SEED),
            source: TenantSource::Bearer,
            id: None,
        }
    }

    /// The tenant's metric and `/debug/routing` label: the header id, `bearer:` and eight hex
    /// digits of the token's hash (opaque, bounded), or `shared`.
    pub fn label(&self) -> String {
        match (self.source, self.id) {
            (TenantSource::Header, Some(id)) => id.to_owned(),
            (TenantSource::Shared, _) => SHARED_LABEL.to_owned(),
            _ => format!("bearer:{:08x}", self.hash >> 32),
        }
    }
}

/// The request's tenant, and why a present `x-flexinfer-tenant` was not used.
pub fn tenant<'h>(headers: &'h HeaderMap, limits: &KeyLimits) -> (Tenant<'h>, Option<Malformed>) {
    let mut bad = None;
    if let Some(value) = header(headers, &HEADER_TENANT) {
        match value.to_str() {
            Ok(raw) => match explicit::validate(raw, limits.explicit_key_max_length) {
                Ok(id) => return (Tenant::named(id), None),
                Err(reason) => bad = Some(reason),
            },
            // Not text: malformed, as an explicit key header would be.
            Err(_) => bad = Some(Malformed::BadCharacter),
        }
    }
    let tenant = bearer_token(headers).map_or(Tenant::SHARED, Tenant::bearer);
    (tenant, bad)
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive), if non-empty.
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = header(headers, &AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value[7..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    fn of(pairs: &[(&str, &[u8])]) -> (TenantSource, u64, Option<Malformed>, String) {
        let h = headers(pairs);
        let (t, bad) = tenant(&h, &KeyLimits::default());
        (t.source, t.hash, bad, t.label())
    }

    #[test]
    fn precedence_and_validation_table() {
        let team_a = Tenant::named("team-a").hash;
        let token = Tenant::bearer(b"sk-secret").hash;
        for (pairs, source, hash, bad) in [
            (
                vec![("x-flexinfer-tenant", &b"team-a"[..])],
                TenantSource::Header,
                team_a,
                None,
            ),
            // Trimmed like an explicit key.
            (
                vec![("x-flexinfer-tenant", b"  team-a ")],
                TenantSource::Header,
                team_a,
                None,
            ),
            // The header beats the token.
            (
                vec![
                    ("authorization", b"Bearer sk-secret"),
                    ("x-flexinfer-tenant", b"team-a"),
                ],
                TenantSource::Header,
                team_a,
                None,
            ),
            // A malformed header falls through to the token, and is reported.
            (
                vec![
                    ("x-flexinfer-tenant", b"team a"),
                    ("authorization", b"Bearer sk-secret"),
                ],
                TenantSource::Bearer,
                token,
                Some(Malformed::BadCharacter),
            ),
            (
                vec![("x-flexinfer-tenant", b"")],
                TenantSource::Shared,
                0,
                Some(Malformed::Empty),
            ),
            (
                vec![("x-flexinfer-tenant", b"caf\xc3\xa9")],
                TenantSource::Shared,
                0,
                Some(Malformed::BadCharacter),
            ),
            (
                vec![("authorization", b"bearer   sk-secret  ")],
                TenantSource::Bearer,
                token,
                None,
            ),
            (
                vec![("authorization", b"BEARER sk-secret")],
                TenantSource::Bearer,
                token,
                None,
            ),
            // Not a bearer token: the shared tenant.
            (
                vec![("authorization", b"Basic dXNlcjpwdw==")],
                TenantSource::Shared,
                0,
                None,
            ),
            (
                vec![("authorization", b"Bearer   ")],
                TenantSource::Shared,
                0,
                None,
            ),
            (
                vec![("authorization", b"Bearer")],
                TenantSource::Shared,
                0,
                None,
            ),
            (vec![], TenantSource::Shared, 0, None),
        ] {
            let (s, h, b, _) = of(&pairs);
            assert_eq!((s, h, b), (source, hash, bad), "{pairs:?}");
        }
    }

    #[test]
    fn a_too_long_id_is_malformed_at_the_explicit_key_limit() {
        let long = "a".repeat(129);
        let (s, _, bad, _) = of(&[("x-flexinfer-tenant", long.as_bytes())]);
        assert_eq!(s, TenantSource::Shared);
        assert_eq!(bad, Some(Malformed::TooLong { len: 129, max: 128 }));
        let h = headers(&[("x-flexinfer-tenant", long.as_bytes())]);
        let limits = KeyLimits {
            explicit_key_max_length: 200,
            ..KeyLimits::default()
        };
        assert_eq!(tenant(&h, &limits).0.source, TenantSource::Header);
    }

    #[test]
    fn labels_never_show_the_token() {
        let (_, _, _, label) = of(&[("authorization", b"Bearer sk-very-secret-token")]);
        assert!(label.starts_with("bearer:") && label.len() == 15, "{label}");
        assert!(!label.contains("secret"));
        assert_eq!(of(&[("x-flexinfer-tenant", b"team-a")]).3, "team-a");
        assert_eq!(of(&[]).3, "shared");
        // The same text as id and as token are different tenants.
        assert_ne!(Tenant::named("abc").hash, Tenant::bearer(b"abc").hash);
    }
}
