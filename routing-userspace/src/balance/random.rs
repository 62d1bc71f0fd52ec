//! Random pick: used when a session strategy finds no session key (spec: "Session ID not
//! found -> Random pod selection"). The random draw is an input, so the order is testable:
//! the pick is `draw % n`, the alternates follow it in turn.

use super::round_robin::Rotation;

pub fn random(draw: u64, n: usize) -> Rotation {
    Rotation::new((draw % n.max(1) as u64) as usize, n)
}
