//! Shared support for the workspace integration tests.
