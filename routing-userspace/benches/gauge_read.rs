//! Gauge read per pod, three ways in one run: the mmapped BPF array (what `EbpfGauge::active`
//! does), a BPF map-lookup syscall on the same array, and the userspace atomic gauge; and the
//! gauge's work per request on a pooled connection (busy and idle marks).
//!
//! The eBPF rows need root and an embedded object (`cargo xtask bench gauge` builds it);
//! without them only the userspace row runs and the reason is printed.

use std::hint::black_box;
use std::net::SocketAddr;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use routing_userspace::ebpf::{pins, EbpfOptions};
use routing_userspace::load::ebpf::EbpfGauge;
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
            group.finish();
            if let Some(cg) = &cgroup {
                per_request(c, &g, cg);
            }
        }
        Err(e) => {
            eprintln!("skipping the eBPF rows: {e}");
            group.finish();
        }
    }
    let _ = pins::remove_pins(&pin_dir);
    if let Some(cg) = &cgroup {
        let _ = std::fs::remove_dir(cg);
    }
}

/// The gauge's work per request over a pooled connection: marking it busy at the start and
/// idle at the end (two atomic operations on the mapped PODS array), and, once per connection,
/// registering it (a socket-cookie lookup in CONNS). The bench process joins the test cgroup
/// for one real connection to a loopback listener, so the kernel claims a real bit for it.
fn per_request(c: &mut Criterion, g: &EbpfGauge, cg: &std::path::Path) {
    use std::os::fd::AsFd;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let root = routing_userspace::ebpf::cgroup::cgroup2_root().expect("cgroup2");
    let back = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| root.join(p.trim_start_matches('/')));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let pod = listener.local_addr().expect("addr");
    g.set_pods(&[(pod, 4)]);
    std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string()).expect("join cgroup");
    let stream = std::net::TcpStream::connect(pod).expect("connect");
    if let Some(back) = &back {
        let _ = std::fs::write(back.join("cgroup.procs"), std::process::id().to_string());
    }
    let mut group = c.benchmark_group("gauge_per_request");
    group.bench_function("register a new connection (once per connection)", |b| {
        b.iter(|| black_box(g.register(stream.as_fd())))
    });
    let track = g
        .register(stream.as_fd())
        .expect("the kernel counts the connection");
    group.bench_function("busy + idle (per request)", |b| {
        b.iter(|| {
            track.busy();
            track.idle();
        })
    });
    group.finish();
    drop(track);
    drop(stream);
}

criterion_group!(benches, gauge_read);
criterion_main!(benches);
