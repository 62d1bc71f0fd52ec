//! The fleet size: how many proxies stand in front of the same pods, so the scraper can
//! spread its page reads over them (each proxy reads a pod once per `fleet / budget` seconds)
//! and the whole fleet stays within the budget.
//!
//! One count, shared: Kubernetes discovery stores the proxies it sees into it, the scraper
//! reads it on every tick, `/metrics` and `/debug/routing` show it. `--fleet-size` fixes it
//! instead; without either (file discovery) it is 1.
//!
//! Beside it, this proxy's rank in the fleet (0-based): discovery stores its own pod's place
//! among the counted pods' names, `--fleet-rank` fixes it with `--fleet-size`. Cache-aware
//! placement reads it for a prompt no pod holds yet, so that proxies that place it before
//! they can see each other do not all send it to one pod (see
//! `crate::balance::cache_aware::Ties::Held`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::scrape::{interval, ScrapeConfig};

/// Where the fleet size comes from (the `source` of `/debug/routing`'s `fleet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetSource {
    /// `--fleet-size` (> 0).
    Flag,
    /// Kubernetes discovery counts the proxy DaemonSet's Running and Ready pods.
    Discovery,
    /// Nothing counts (file discovery): one proxy.
    Single,
}

impl FleetSource {
    pub fn as_str(self) -> &'static str {
        match self {
            FleetSource::Flag => "flag",
            FleetSource::Discovery => "discovery",
            FleetSource::Single => "single",
        }
    }
}

/// The fleet as the router reads it: how many proxies stand in front of the same pods (0 until
/// discovery has counted them), and this proxy's rank among them.
#[derive(Debug, Clone)]
pub struct FleetPlace {
    pub size: Arc<AtomicUsize>,
    pub rank: Arc<AtomicUsize>,
}

impl FleetPlace {
    /// A place that nothing moves.
    pub fn fixed(size: usize, rank: usize) -> Self {
        Self {
            size: Arc::new(AtomicUsize::new(size)),
            rank: Arc::new(AtomicUsize::new(rank)),
        }
    }

    /// The proxies counted (0: not counted yet).
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// This proxy's rank, 0-based (it may reach past the size for a moment while a count
    /// moves: readers take it modulo what they choose among).
    pub fn rank(&self) -> usize {
        self.rank.load(Ordering::Relaxed)
    }
}

/// The shared fleet size and what it yields for the scraper.
#[derive(Debug, Clone)]
pub struct Fleet {
    place: FleetPlace,
    source: FleetSource,
    /// `(budget, shortest interval)` of the scraper; `None`: no scraper.
    scrape: Option<(f64, Duration)>,
}

impl Fleet {
    /// `flag` is `--fleet-size` (0: not set) and `rank` `--fleet-rank` (read with the flag
    /// only); `counted` says whether discovery counts the proxies (Kubernetes) when the flag
    /// is not set.
    pub fn new(flag: usize, rank: usize, counted: bool, scrape: Option<&ScrapeConfig>) -> Self {
        let source = match (flag, counted) {
            (1.., _) => FleetSource::Flag,
            (0, true) => FleetSource::Discovery,
            (0, false) => FleetSource::Single,
        };
        // Until discovery has counted, the size is unknown (0): read as one proxy for the
        // scrape budget, but no proxy takes itself to be alone.
        let size = match source {
            FleetSource::Discovery => 0,
            _ => flag.max(1),
        };
        let rank = match source {
            FleetSource::Flag => rank,
            FleetSource::Discovery | FleetSource::Single => 0,
        };
        Self {
            place: FleetPlace::fixed(size, rank),
            source,
            scrape: scrape.map(|c| (c.budget, c.min_interval)),
        }
    }

    /// The count and rank discovery stores into, when it is the source (else `None`: nothing
    /// may move them).
    pub fn counter(&self) -> Option<FleetPlace> {
        (self.source == FleetSource::Discovery).then(|| self.place())
    }

    /// The size and rank the router reads.
    pub fn place(&self) -> FleetPlace {
        self.place.clone()
    }

    /// The count the scraper reads.
    pub fn shared(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.place.size)
    }

    pub fn source(&self) -> FleetSource {
        self.source
    }

    /// The proxies of the fleet (at least 1).
    pub fn proxies(&self) -> usize {
        self.place.size().max(1)
    }

    /// This proxy's rank in the fleet (0-based).
    pub fn rank(&self) -> usize {
        self.place.rank()
    }

    /// How often this proxy reads each pod's page at this fleet size (`None`: no scraping).
    pub fn scrape_interval(&self) -> Option<Duration> {
        let (budget, min) = self.scrape?;
        interval(self.proxies(), budget, min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_only_discovery_may_move_the_count() {
        let cfg = ScrapeConfig::default();
        let flag = Fleet::new(10, 4, true, Some(&cfg));
        assert_eq!(
            (flag.source(), flag.proxies(), flag.rank()),
            (FleetSource::Flag, 10, 4)
        );
        assert!(flag.counter().is_none());
        assert_eq!(flag.scrape_interval(), Some(Duration::from_secs(10)));

        let counted = Fleet::new(0, 4, true, Some(&cfg));
        assert_eq!(counted.proxies(), 1);
        assert_eq!(
            counted.shared().load(Ordering::Relaxed),
            0,
            "not counted yet: nobody is alone"
        );
        let counter = counted.counter().unwrap();
        assert_eq!(
            counted.rank(),
            0,
            "the flag's rank goes with the flag's size"
        );
        counter.size.store(100, Ordering::Relaxed);
        counter.rank.store(7, Ordering::Relaxed);
        assert_eq!((counted.place().size(), counted.place().rank()), (100, 7));
        assert_eq!(counted.proxies(), 100);
        assert_eq!(counted.scrape_interval(), Some(Duration::from_secs(100)));
        assert_eq!(counted.shared().load(Ordering::Relaxed), 100);

        let single = Fleet::new(0, 2, false, None);
        assert_eq!(
            (single.source(), single.proxies()),
            (FleetSource::Single, 1)
        );
        assert!(single.counter().is_none() && single.scrape_interval().is_none());
        // A count of 0 (never stored as such, but read defensively) is one proxy.
        single.shared().store(0, Ordering::Relaxed);
        assert_eq!(single.proxies(), 1);
    }
}
