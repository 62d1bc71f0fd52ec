//! flexinfer-proxy: an L7 request router for OpenAI-compatible model servers.
//!
//! The request path lives in [`proxy`], as named phases; the decision it asks for comes from
//! the [`router`], built from [`keys`] (what pins a request) and [`balance`] (how candidates
//! are ordered) over the immutable [`table`] that [`discovery`] updates rebuild, following the
//! [`rules`]; [`admission`] holds requests while a model's pods are full. [`upstream`] owns
//! the pooled connections to pods, [`load`] the gauges, [`signals`] what the pods' engines
//! report about their load and prompt cache, [`metrics`] the spec's metric families. [`vocab`]
//! holds the words they all share; [`app`]
//! wires everything for `serve`. [`replay`] runs request traces through the same router in
//! simulated time.

pub mod admin;
pub mod admission;
pub mod app;
pub mod balance;
pub mod body;
pub mod buffers;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod ebpf;
pub mod header_lookup;
pub mod keys;
pub mod load;
pub mod lock;
pub mod metrics;
pub mod open_files;
pub mod percent;
pub mod proxy;
pub mod replay;
pub mod router;
pub mod rules;
pub mod signals;
pub mod sim;
pub mod table;
pub mod telemetry;
pub mod upstream;
pub mod vocab;
