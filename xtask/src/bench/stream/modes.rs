//! The modes of `bench stream`: what the upstreams send and how many streams the load
//! generator holds.
//!
//! Throughput modes measure relayed events per second and the proxy's CPU per event: `paced`
//! (1,000 connections, each answer 50 events 20 ms apart, one answer after another) and `bulk`
//! (32 connections, each answer's 200 events written at once). Scale modes hold every stream
//! open for the whole window (answers far longer than the run) and measure memory per open
//! stream and the delay added to each event: `scale-1k` (1,000 streams at 50 events/s) and
//! `scale-8k` (8,000 at 2 events/s: the memory and wakeup test). `idle` opens keep-alive
//! client connections that send nothing, for the memory of an idle connection; `idle-used`
//! has each read one short answer first and then send nothing (a client's pooled connection
//! between two requests: what a proxy keeps of a connection once it has served it).

use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Mode {
    Paced,
    Bulk,
    Scale1k,
    Scale8k,
    Idle,
    IdleUsed,
}

pub(super) const MODES: [Mode; 6] = [
    Mode::Paced,
    Mode::Bulk,
    Mode::Scale1k,
    Mode::Scale8k,
    Mode::Idle,
    Mode::IdleUsed,
];

/// Content events per answer in the scale modes: longer than any run, so streams stay open.
const ENDLESS: u32 = 1_000_000;

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Paced => "paced",
            Mode::Bulk => "bulk",
            Mode::Scale1k => "scale-1k",
            Mode::Scale8k => "scale-8k",
            Mode::Idle => "idle",
            Mode::IdleUsed => "idle-used",
        }
    }

    /// What the mode runs, with the paced mode's stream count.
    pub(super) fn what(self, paced_streams: usize) -> String {
        match self {
            Mode::Paced => format!(
                "{paced_streams} connections, answers of 50 events 20 ms apart, one after another"
            ),
            Mode::Bulk => {
                "32 connections, answers of 200 events written at once, one after another".into()
            }
            Mode::Scale1k => "1,000 streams open for the whole window, 50 events/s each".into(),
            Mode::Scale8k => "8,000 streams open for the whole window, 2 events/s each".into(),
            Mode::Idle => "keep-alive client connections that send nothing".into(),
            Mode::IdleUsed => {
                "keep-alive client connections idle after one answer of 5 events each".into()
            }
        }
    }

    /// Streams (or idle connections) the load generator opens.
    pub(super) fn connections(self, idle_connections: usize, paced_streams: usize) -> usize {
        match self {
            Mode::Paced => paced_streams,
            Mode::Scale1k => 1000,
            Mode::Bulk => 32,
            Mode::Scale8k => 8000,
            Mode::Idle | Mode::IdleUsed => idle_connections,
        }
    }

    /// Content events per answer, the time between two, and whether all go in one write.
    pub(super) fn pacing(self) -> (u32, Duration, bool) {
        match self {
            Mode::Paced => (50, Duration::from_millis(20), false),
            Mode::Bulk => (200, Duration::ZERO, true),
            Mode::Scale1k => (ENDLESS, Duration::from_millis(20), false),
            Mode::Scale8k => (ENDLESS, Duration::from_millis(500), false),
            Mode::Idle => (1, Duration::ZERO, true),
            Mode::IdleUsed => (5, Duration::ZERO, true),
        }
    }

    pub(super) fn is_scale(self) -> bool {
        matches!(self, Mode::Scale1k | Mode::Scale8k)
    }

    /// Connections that hold no stream: only the proxies' memory per connection is measured.
    pub(super) fn is_idle(self) -> bool {
        matches!(self, Mode::Idle | Mode::IdleUsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issues_rates() {
        for (m, streams, per_s) in [(Mode::Scale1k, 1000, 50), (Mode::Scale8k, 8000, 2)] {
            let (events, interval, bulk) = m.pacing();
            assert_eq!(m.connections(0, 5), streams);
            assert_eq!(
                Duration::from_secs(1).as_millis() / interval.as_millis(),
                per_s
            );
            assert!(
                !bulk && events as u128 * interval.as_millis() > 3_600_000,
                "endless"
            );
        }
        assert_eq!(Mode::Paced.pacing(), (50, Duration::from_millis(20), false));
        assert_eq!(Mode::Bulk.pacing().0, 200);
        assert_eq!(Mode::Idle.connections(123, 5), 123);
        assert_eq!(Mode::IdleUsed.connections(123, 5), 123);
        assert_eq!(Mode::Paced.connections(123, 5), 5);
        assert!(Mode::IdleUsed.is_idle() && !Mode::Scale8k.is_idle());
    }
}
