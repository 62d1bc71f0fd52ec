//! Shared support for the workspace integration tests.
//!
//! The eBPF helpers give each test its own child cgroup and pin directory and clean both up
//! on drop, so tests run in parallel without seeing each other's connections, and leave
//! nothing attached or pinned. Connections are made by a helper process (`conn-holder`)
//! started inside the child cgroup, so the test process itself never changes cgroup.

pub mod ebpf;
