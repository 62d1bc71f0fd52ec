//! The part of xtask that the integration tests share: container engines and image builds.
//!
//! `cargo xtask image` builds the proxy image users deploy; the container tests build the image
//! they run the same way (same Dockerfile, same engine settings, same offline base), so a test
//! failure points at what users get rather than at a test-only recipe.

pub mod container;
pub mod paths;
