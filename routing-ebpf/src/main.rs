//! eBPF programs (filled by the eBPF data plane work).
fn main() {}
