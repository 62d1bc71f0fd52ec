//! What admission needs to know of a request, read from its head: its priority band and its
//! tenant. A pure function of the headers and the key limits; bad values fall back to the
//! defaults and are reported, never fatal.

use http::HeaderMap;

use super::priority::{self, BadPriority};
use super::tenant::{self, Tenant};
use crate::keys::explicit::Malformed;
use crate::keys::KeyLimits;

/// A request's place in a model's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class<'h> {
    /// Higher is served first; negative is sheddable.
    pub priority: i32,
    pub tenant: Tenant<'h>,
}

impl Class<'static> {
    /// Priority 0, the shared tenant: a request that says nothing.
    pub const DEFAULT: Class<'static> = Class {
        priority: priority::DEFAULT_PRIORITY,
        tenant: Tenant::SHARED,
    };
}

/// A class, and the header values it had to ignore (for a debug line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified<'h> {
    pub class: Class<'h>,
    pub bad_priority: Option<BadPriority>,
    pub bad_tenant: Option<Malformed>,
}

/// Classify a request by its head.
pub fn classify<'h>(headers: &'h HeaderMap, limits: &KeyLimits) -> Classified<'h> {
    let (priority, bad_priority) = priority::priority(headers);
    let (tenant, bad_tenant) = tenant::tenant(headers, limits);
    Classified {
        class: Class { priority, tenant },
        bad_priority,
        bad_tenant,
    }
}

impl Classified<'_> {
    /// The debug lines for ignored header values (none when everything was usable).
    pub fn log_ignored(&self, model: &str) {
        if let Some(bad) = self.bad_priority {
            tracing::debug!(
                model,
                reason = bad.as_str(),
                "ignoring x-flexinfer-priority; using 0"
            );
        }
        if let Some(bad) = self.bad_tenant {
            tracing::debug!(model, reason = ?bad, tenant_source = self.class.tenant.source.as_str(), "ignoring malformed x-flexinfer-tenant");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::tenant::TenantSource;
    use http::HeaderValue;

    #[test]
    fn both_headers_are_read_and_bad_ones_reported() {
        let mut h = HeaderMap::new();
        let c = classify(&h, &KeyLimits::default());
        assert_eq!(c.class, Class::DEFAULT);
        assert_eq!((c.bad_priority, c.bad_tenant), (None, None));
        h.insert("x-flexinfer-priority", HeaderValue::from_static("10"));
        h.insert("x-flexinfer-tenant", HeaderValue::from_static("team-b"));
        let c = classify(&h, &KeyLimits::default());
        assert_eq!(c.class.priority, 10);
        assert_eq!(c.class.tenant, Tenant::named("team-b"));
        h.insert("x-flexinfer-priority", HeaderValue::from_static("ten"));
        h.insert("x-flexinfer-tenant", HeaderValue::from_static("team b"));
        let c = classify(&h, &KeyLimits::default());
        assert_eq!(c.class.priority, 0);
        assert_eq!(c.class.tenant.source, TenantSource::Shared);
        assert_eq!(c.bad_priority, Some(BadPriority::NotAnInteger));
        assert_eq!(c.bad_tenant, Some(Malformed::BadCharacter));
        c.log_ignored("m");
    }
}
