//! Engine reports in a replay: what each router hears of the pods' real load, and when.
//!
//! As in `serve`, a router learns a pod's engine state two ways: in-band, on the head of each
//! response the pod sends it (the pod's state when it started that request), and by scraping
//! the pod's metrics page, at the interval the scrape budget gives one proxy of the fleet
//! (`fleet / budget` seconds), only while no fresh in-band report covers the pod. Every report
//! reaches its router `delay` after the pod's state it describes (the network, the scrape's own
//! time): a router's view is late by that much, as it is in a real fleet.
//!
//! Pure bookkeeping: the schedule says which report is due when; the caller hands it to the
//! router's [`crate::signals::SignalStore`] exactly as `serve` does.

use std::collections::BTreeMap;

use clap::ValueEnum;

use crate::signals::store::Stamp;
use crate::signals::{EngineReport, Source};

/// Which engine reports the routers get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportKinds {
    /// In-band on responses, and scrapes for pods without a fresh in-band report.
    Both,
    InBand,
    Scrape,
    /// None: each router sees only its own requests in flight.
    None,
}

impl ReportKinds {
    fn in_band(self) -> bool {
        matches!(self, ReportKinds::Both | ReportKinds::InBand)
    }

    fn scrape(self) -> bool {
        matches!(self, ReportKinds::Both | ReportKinds::Scrape)
    }
}

/// A report on its way to a router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Due {
    pub router: usize,
    pub pod: usize,
    pub report: EngineReport,
    pub source: Source,
    /// When the pod's state was taken.
    pub taken_us: u64,
    /// When it reaches the router.
    pub at_us: u64,
    /// A scrape's stamp, taken as it asked (an in-band report is stamped as it arrives).
    pub stamp: Option<Stamp>,
}

/// Reports of every pod to every router, in delivery order.
#[derive(Debug)]
pub struct ReportSchedule {
    kinds: ReportKinds,
    delay_us: u64,
    /// Each router's next scrape round (all pods), when scraping.
    scrape_every_us: Option<u64>,
    next_scrape: Vec<u64>,
    /// (delivery time, sequence) -> report.
    pending: BTreeMap<(u64, u64), Due>,
    seq: u64,
}

/// A pod's state as an engine reports it.
pub fn engine_state(running: usize, waiting: usize) -> EngineReport {
    EngineReport {
        running: Some(running as u64),
        waiting: Some(waiting as u64),
        kv_usage: None,
    }
}

impl ReportSchedule {
    /// `routers` routers; scrape rounds every `scrape_every_us` (per router), the first ones
    /// spread over one interval so the routers do not scrape in step.
    pub fn new(
        kinds: ReportKinds,
        routers: usize,
        delay_us: u64,
        scrape_every_us: Option<u64>,
    ) -> Self {
        let every = scrape_every_us.filter(|_| kinds.scrape());
        let next_scrape = (0..routers)
            .map(|r| every.map_or(u64::MAX, |e| e * r as u64 / routers.max(1) as u64))
            .collect();
        Self {
            kinds,
            delay_us,
            scrape_every_us: every,
            next_scrape,
            pending: BTreeMap::new(),
            seq: 0,
        }
    }

    fn push(&mut self, due: Due) {
        self.seq += 1;
        self.pending.insert((due.at_us, self.seq), due);
    }

    /// A response head from `pod` reaches `router` at `head_us` with the pod's state `state`.
    pub fn response(&mut self, router: usize, pod: usize, state: EngineReport, head_us: u64) {
        if self.kinds.in_band() {
            self.push(Due {
                router,
                pod,
                report: state,
                source: Source::InBand,
                taken_us: head_us,
                at_us: head_us + self.delay_us,
                stamp: None,
            });
        }
    }

    /// The scrape rounds due by `now_us`, as (router, round time): the caller asks
    /// [`Self::scraped`] for each pod the router wants scraped then.
    pub fn scrape_rounds(&mut self, now_us: u64) -> Vec<(usize, u64)> {
        let Some(every) = self.scrape_every_us else {
            return Vec::new();
        };
        let mut rounds = Vec::new();
        for (r, next) in self.next_scrape.iter_mut().enumerate() {
            while *next <= now_us {
                rounds.push((r, *next));
                *next += every.max(1);
            }
        }
        rounds
    }

    /// `router` read `pod`'s page at `round_us`, finding `state`; `stamp` was taken as it
    /// asked.
    pub fn scraped(
        &mut self,
        router: usize,
        pod: usize,
        state: EngineReport,
        round_us: u64,
        stamp: Stamp,
    ) {
        self.push(Due {
            router,
            pod,
            report: state,
            source: Source::Scrape,
            taken_us: round_us,
            at_us: round_us + self.delay_us,
            stamp: Some(stamp),
        });
    }

    /// The next report that has reached its router by `now_us`, oldest first.
    pub fn next_due(&mut self, now_us: u64) -> Option<Due> {
        let (&(at, _), _) = self.pending.first_key_value()?;
        if at > now_us {
            return None;
        }
        self.pending.pop_first().map(|(_, due)| due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_arrive_after_the_delay_in_order() {
        let mut s = ReportSchedule::new(ReportKinds::InBand, 2, 100, None);
        s.response(1, 0, engine_state(3, 1), 50);
        s.response(0, 2, engine_state(1, 0), 10);
        assert_eq!(s.next_due(109), None);
        let first = s.next_due(110).unwrap();
        assert_eq!((first.router, first.pod, first.at_us), (0, 2, 110));
        assert_eq!(s.next_due(149), None);
        let second = s.next_due(1_000).unwrap();
        assert_eq!((second.router, second.report.running), (1, Some(3)));
        assert_eq!(s.next_due(u64::MAX), None);
    }

    #[test]
    fn scrape_rounds_are_spread_over_the_routers_and_repeat() {
        let mut s = ReportSchedule::new(ReportKinds::Scrape, 4, 0, Some(1_000));
        assert_eq!(s.scrape_rounds(0), vec![(0, 0)]);
        assert_eq!(s.scrape_rounds(999), vec![(1, 250), (2, 500), (3, 750)]);
        assert_eq!(
            s.scrape_rounds(2_000),
            vec![(0, 1_000), (0, 2_000), (1, 1_250), (2, 1_500), (3, 1_750)]
        );
    }

    #[test]
    fn kinds_turn_sources_off() {
        let mut s = ReportSchedule::new(ReportKinds::Scrape, 1, 0, Some(10));
        s.response(0, 0, engine_state(1, 0), 0);
        assert_eq!(s.next_due(u64::MAX), None, "no in-band reports");
        let mut s = ReportSchedule::new(ReportKinds::InBand, 1, 0, Some(10));
        assert!(s.scrape_rounds(1_000).is_empty(), "no scrapes");
        let mut s = ReportSchedule::new(ReportKinds::None, 1, 0, Some(10));
        s.response(0, 0, engine_state(1, 0), 0);
        assert!(s.scrape_rounds(1_000).is_empty());
        assert_eq!(s.next_due(u64::MAX), None);
    }
}
