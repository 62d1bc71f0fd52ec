//! Shared support for the workspace integration tests.

/// eBPF test harness: child cgroups, pin dirs, connection-holding helper processes.
pub mod ebpf;
