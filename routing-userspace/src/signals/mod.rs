//! Engine signals: what the pods themselves say about their load and their prompt cache, so N
//! proxies in front of the same pods see each pod's real load instead of their own 1/N share.
//!
//! Three ways in, one store:
//! - [`orca`]: the load report an engine puts on each response when asked
//!   (`endpoint-load-metrics`), read as the response head passes;
//! - [`scrape`]: a background task reading each pod's metrics page ([`engine_metrics`]) when no
//!   fresh in-band report gives its whole load, at a rate bounded for the whole fleet;
//! - [`usage`]: the token counts (cached prompt tokens included) in each response body.
//!
//! [`store`] keeps the last report of each pod and turns it, with the requests this node
//! started since and what [`others`] predicts of the other nodes' part, into the load a pick
//! reads. Everything from a pod is untrusted input: capped
//! in size, checked for sane numbers ([`report`]), and at worst it changes only that pod's
//! signal. Nothing here runs on the request path except header and body reads that cost a
//! memchr-class scan, and the store's few atomic loads and adds.

pub mod engine_metrics;
pub mod fleet;
pub mod metrics;
pub mod orca;
pub mod others;
pub mod report;
pub mod scrape;
pub mod settings;
pub mod slot_prompts;
pub mod store;
pub mod usage;

pub use fleet::{Fleet, FleetSource};
pub use metrics::{EngineFamilies, PodSignalMetrics};
pub use report::{EngineReport, Source};
pub use scrape::{ScrapeConfig, ScrapeTarget, ScrapeTargets, Scraper};
pub use settings::SignalSettings;
pub use store::{SignalStore, SignalView};
pub use usage::{Usage, UsageObserver};
