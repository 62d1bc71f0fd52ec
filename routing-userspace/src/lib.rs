//! flexinfer-proxy: an L7 request router for OpenAI-compatible model servers.

pub mod balance;
pub mod body;
pub mod decide;
pub mod discovery;
pub mod keys;
pub mod load;
pub mod table;
