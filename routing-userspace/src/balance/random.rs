//! Random pick: used when a session strategy finds no session key (spec: "Session ID not
//! found -> Random pod selection"). The random draw is an input, so the order is testable.

use super::round_robin::RoundRobin;
use super::Selection;

pub struct RandomPick {
    pub draw: u64,
}

impl Selection for RandomPick {
    fn order(&self, n: usize) -> Vec<usize> {
        RoundRobin {
            ticket: self.draw as usize,
        }
        .order(n)
    }
}
