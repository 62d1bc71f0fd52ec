//! flexinfer-proxy: an L7 request router for OpenAI-compatible model servers.

pub mod balance;
pub mod discovery;
pub mod ebpf;
pub mod load;
