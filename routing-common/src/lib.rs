//! Types shared by the kernel (routing-ebpf) and user (routing-userspace) sides.
#![no_std]

/// Number of pod slots in the load gauge array.
pub const MAX_PODS: u32 = 4096;
