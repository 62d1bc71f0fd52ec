//! The measuring harness that `cargo xtask bench`, `cargo xtask soak` and the tests share:
//! statistics ([`stats`]), result directories and markdown tables ([`report`]), one blocking
//! HTTP/1.1 client with an SSE reader ([`http`]), and what the harness reads from or sets in the
//! OS about the processes it runs ([`os`]; the process guard itself is [`crate::Proc`]).
//!
//! One copy of each, so two benches never disagree on what "p99" means or how a chunked body
//! ends. Plain blocking std code, like the rest of this crate: a bench that needs thousands of
//! connections at once uses [`crate::stream`], which is built on the same parsers.

pub mod http;
pub mod os;
pub mod report;
pub mod stats;
