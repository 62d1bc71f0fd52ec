//! Shared support for the workspace integration tests.

pub mod chart;
