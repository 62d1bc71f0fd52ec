//! The workspace integration tests, one module per area, in one test binary.
//!
//! One binary instead of one per file: each used to link the whole stack (routing-userspace,
//! kube, aya, hyper) again, which cost most of the test build's disk and link time. The tests
//! share this process, so none may change process-wide state (environment, working directory,
//! signal handlers, rlimits): configuration goes to the child processes they start, each test
//! has its own ports, scratch dirs, cgroups and pin dirs, and `container` builds its image once
//! for all. Tests that cannot run here (no BPF, no podman, no Prometheus) say so through
//! `flexinfer_tests::skip`, which `cargo xtask test` counts apart from passes.

mod admission;
mod bad_input;
mod bpffs_mount;
mod chart;
mod chart_env;
mod config_check;
mod container;
mod docs;
mod ebpf_gauge;
mod ebpf_keepalive;
mod ebpf_load;
mod ebpf_proxy;
mod failures;
mod fleet_slot_prompts;
mod knobs_and_groups;
mod manifests;
mod models_file;
mod observability;
mod prometheus;
mod proxying;
mod reservations;
mod routing;
mod tracing_otel;
