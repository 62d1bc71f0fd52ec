//! Loopback request/response between two processes of one cgroup, with the sk_msg same-node
//! redirect off and on (the sock_ops gauge is attached in both cases). Each iteration is one
//! round trip: the client writes N bytes and reads the echo back.
//!
//! Needs root (skips with a message otherwise): `cargo xtask bench redirect`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flexinfer_tests::ebpf::{bpf_missing, Holder, TestCgroup, TestPins};
use routing_userspace::ebpf::EbpfGauge;
use routing_userspace::load::LoadGauge;

const HOLDER: &str = env!("CARGO_BIN_EXE_conn-holder");

fn loopback(c: &mut Criterion) {
    if let Some(why) = bpf_missing() {
        eprintln!("skipping the redirect bench: {why}");
        return;
    }
    let mut group = c.benchmark_group("loopback_roundtrip");
    for redirect in [false, true] {
        let mode = if redirect {
            "redirect_on"
        } else {
            "redirect_off"
        };
        let cg = TestCgroup::new();
        let mut pins = TestPins::new(&cg);
        pins.opts.redirect = redirect;
        let gauge = EbpfGauge::open(&pins.opts).expect("open the eBPF gauge");
        let mut server = Holder::spawn(Path::new(HOLDER), &cg.path);
        let pod = server.serve();
        gauge.set_pods(&[(pod, 0)]);
        let mut client = Holder::spawn(Path::new(HOLDER), &cg.path);
        client.open(pod, 1);
        assert_eq!(gauge.active(0), 1, "the bench connection is counted");
        for size in [64usize, 64 * 1024] {
            group.throughput(Throughput::Bytes(2 * size as u64));
            group.bench_with_input(BenchmarkId::new(mode, size), &size, |b, &size| {
                b.iter_custom(|iters| client.pingpong(size, iters))
            });
        }
        drop(client);
        drop(server);
    }
    group.finish();
}

criterion_group!(benches, loopback);
criterion_main!(benches);
