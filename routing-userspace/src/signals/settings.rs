//! The engine-signal settings `serve` runs with (the flags are in `config::args`, validated by
//! `config::settings`).

use std::time::Duration;

use super::scrape::ScrapeConfig;
use super::store::DEFAULT_STALENESS;

/// Validated engine-signal settings.
#[derive(Debug, Clone)]
pub struct SignalSettings {
    /// Send the ORCA request header and read the response header.
    pub inband: bool,
    /// How long an in-band report counts.
    pub staleness: Duration,
    /// `None`: no scraping.
    pub scrape: Option<ScrapeConfig>,
    /// A fixed fleet size (0: from discovery).
    pub fleet_size: usize,
    /// This proxy's rank with a fixed fleet size.
    pub fleet_rank: usize,
}

impl Default for SignalSettings {
    fn default() -> Self {
        Self {
            inband: true,
            staleness: DEFAULT_STALENESS,
            scrape: Some(ScrapeConfig::default()),
            fleet_size: 0,
            fleet_rank: 0,
        }
    }
}
