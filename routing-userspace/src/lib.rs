//! flexinfer-proxy: an L7 request router for OpenAI-compatible model servers.
//!
//! The request path lives in [`proxy`]; the decision it asks for is [`decide`], built from
//! [`keys`] (what pins a request) and [`balance`] (how candidates are ordered) over the
//! immutable [`table`] that [`discovery`] updates rebuild. [`load`] holds the gauges and the
//! reservation ledger, [`metrics`] the spec's metric families.

pub mod admin;
pub mod app;
pub mod balance;
pub mod body;
pub mod config;
pub mod decide;
pub mod demo;
pub mod discovery;
pub mod ebpf;
pub mod keys;
pub mod load;
pub mod metrics;
pub mod proxy;
pub mod sim;
pub mod state;
pub mod table;
