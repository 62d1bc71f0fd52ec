//! Gauge read per pod, three ways in one run: the mmapped BPF array (what `EbpfGauge::active`
//! does), a BPF map-lookup syscall on the same array, and the userspace atomic gauge.
//!
//! The eBPF rows need root and an embedded object (`cargo xtask bench gauge` builds it);
//! without them only the userspace row runs and the reason is printed.

use std::hint::black_box;
use std::net::SocketAddr;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use routing_userspace::ebpf::{pins, EbpfGauge, EbpfOptions};
use routing_userspace::load::userspace::UserspaceGauge;
use routing_userspace::load::LoadGauge;

fn gauge_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("gauge_read");
    let pod: SocketAddr = "127.0.0.1:9".parse().expect("addr");

    let user = UserspaceGauge::default();
    group.bench_function("userspace_atomic", |b| {
        b.iter(|| black_box(user.active(black_box(3))))
    });

    // Its own pin dir and a fresh empty cgroup, so the bench never touches a live node set.
    let pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/flexinfer-bench-{}",
        std::process::id()
    ));
    let cgroup = routing_userspace::ebpf::cgroup::cgroup2_root()
        .ok()
        .map(|r| r.join(format!("flexinfer-bench-{}", std::process::id())));
    if let Some(cg) = &cgroup {
        let _ = std::fs::create_dir(cg);
    }
    let opts = EbpfOptions {
        cgroup: cgroup.clone(),
        pin_dir: pin_dir.clone(),
        ..EbpfOptions::default()
    };
    match EbpfGauge::open(&opts) {
        Ok(g) => {
            g.set_pods(&[(pod, 3)]);
            group.bench_function("ebpf_mmap", |b| {
                b.iter(|| black_box(g.active(black_box(3))))
            });
            group.bench_function("ebpf_map_lookup_syscall", |b| {
                b.iter(|| black_box(g.active_by_syscall(black_box(3))))
            });
        }
        Err(e) => eprintln!("skipping the eBPF rows: {e}"),
    }
    group.finish();
    let _ = pins::remove_pins(&pin_dir);
    if let Some(cg) = &cgroup {
        let _ = std::fs::remove_dir(cg);
    }
}

criterion_group!(benches, gauge_read);
criterion_main!(benches);
