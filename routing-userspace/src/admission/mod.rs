//! Admission: between the routing decision and the forward phase, the per-model gate that
//! holds requests while the model's pods are full, and lets them go in (priority, tenant turn,
//! arrival) order as room appears.
//!
//! - [`classify`](mod@classify): a request's priority (`x-flexinfer-priority`) and tenant
//!   (`x-flexinfer-tenant`, else a hash of the bearer token, else one shared tenant);
//! - [`queue`]: priority bands, weighted turns between tenants within a band
//!   ([`weights`]: every tenant 1 unless named), FCFS per tenant;
//! - [`gate`]: the async admission itself, timeouts, shedding, client disconnects and drain;
//!   the caller says when there is room ([`Room`], with [`FullWhen`] as the per-pod rule);
//! - [`budget`]: token buckets per (model, tenant);
//! - [`rejection`]: the OpenAI-shaped 429 / 503 answers;
//! - [`settings`], [`metrics`], [`view`]: configuration, metric handles, `/debug/routing`.
//!
//! Trade-offs: each proxy of a fleet enforces its own queue and its own budgets (no
//! router-to-router protocol): a tenant whose requests reach N proxies may use up to N times
//! its `tokensPerMinute`, and `maxConcurrency` holds per pod only as far as the load signals
//! the caller's room rule reads are fleet-wide (the engine reports are; this proxy's own
//! in-flight count is not). Fairness is by request count, not by tokens: a tenant of long
//! prompts gets as many turns as one of short ones.

pub mod budget;
pub mod capacity;
pub mod classify;
pub mod gate;
pub mod metrics;
pub mod permit;
pub mod priority;
pub mod queue;
pub mod registry;
pub mod rejection;
pub mod settings;
pub mod tenant;
pub mod view;
pub mod weights;

pub use capacity::{Above, EngineQueue, FullWhen};
pub use classify::{classify, Class, Classified};
pub use gate::{Admit, Admitted, ModelGate, Room};
pub use metrics::AdmissionFamilies;
pub use permit::AdmissionPermit;
pub use registry::Admission;
pub use rejection::Rejection;
pub use settings::{AdmissionDefaults, GateSettings, ModelAdmission};
pub use view::GateView;
pub use weights::TenantWeights;
