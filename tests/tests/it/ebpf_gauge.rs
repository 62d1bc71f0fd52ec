//! The eBPF gauge against real loopback sockets in a child cgroup.
//!
//! Each test creates its own cgroup and pin directory, attaches there, and makes connections
//! from a helper process it moves into that cgroup. They fail (not skip) whenever BPF is
//! usable but the data plane misbehaves; they skip only without root / bpf(), and even then
//! fail when FLEXINFER_REQUIRE_EBPF is set.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use flexinfer_tests::ebpf::{
    bpf_or_skip, ebpf_required, test_cgroup, wait_for, Cgroup, Holder, TestPins,
};
use routing_userspace::ebpf::{cli, pins, sys, EbpfError, EbpfOptions};
use routing_userspace::load::ebpf::EbpfGauge;
use routing_userspace::load::LoadGauge;

const HOLDER: &str = env!("CARGO_BIN_EXE_conn-holder");

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let a = l.local_addr().expect("local addr");
    (l, a)
}

fn attached(cgroup: &Path) -> Vec<u32> {
    sys::sock_ops_attached(&File::open(cgroup).expect("open cgroup")).expect("BPF_PROG_QUERY")
}

fn open(opts: &EbpfOptions) -> EbpfGauge {
    match EbpfGauge::open(opts) {
        Ok(g) => g,
        Err(e) => panic!("EbpfGauge::open failed: {e}"),
    }
}

/// The pin directories are 0700 and every pinned object 0600: only root reads the loads or
/// writes the pod table.
fn assert_pins_are_root_only(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    let mut seen = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
        for e in std::fs::read_dir(&d).expect("read pin dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                assert_eq!(mode(&p), 0o600, "{}", p.display());
                seen += 1;
            }
        }
    }
    assert!(
        seen >= 4,
        "maps and the link are pinned under {}",
        dir.display()
    );
}

const SETTLE: Duration = Duration::from_secs(3);

#[test]
fn counts_connections_to_tracked_pods_only() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    assert!(gauge.created(), "a fresh pin dir is created, not reopened");
    assert_eq!(
        attached(cg.path()).len(),
        1,
        "sock_ops attached once to the test cgroup"
    );
    assert_pins_are_root_only(&pins.opts.pin_dir);

    let (_tracked, pod) = listener();
    let (_other, untracked) = listener();
    // Proxy slot 7 on purpose: the gauge maps proxy slots to node-wide kernel slots.
    gauge.set_pods(&[(pod, 7)]);
    assert_eq!(gauge.active(7), 0);

    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    assert_eq!(
        cg.procs(),
        vec![h.pid()],
        "only the helper is in the test cgroup"
    );
    h.open(pod, 5);
    h.open(untracked, 3);
    assert_eq!(
        gauge.active(7),
        5,
        "five established connections to the tracked pod"
    );
    assert_eq!(
        gauge.kernel_loads().iter().sum::<u64>(),
        5,
        "untracked connections are not counted"
    );
    assert_eq!(gauge.active(8), 0, "an unassigned slot reads zero");

    h.close(2);
    assert_eq!(gauge.active(7), 3, "closing two leaves three");

    // status (another reader of the pins) sees the same numbers.
    let mut out = Vec::new();
    cli::status_to(&pins.opts, &mut out).expect("status");
    let out = String::from_utf8(out).expect("utf8");
    assert!(
        out.contains(&format!("       3  {pod}")),
        "status output:\n{out}"
    );

    h.close(6);
    let loads = gauge.kernel_loads();
    assert!(
        loads.iter().all(|&v| v == 0),
        "every slot reads 0 after all close: {:?}",
        loads
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0)
            .collect::<Vec<_>>()
    );
}

#[test]
fn reopening_pins_continues_counts_without_double_attach() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let (_l, pod) = listener();

    let first = open(&pins.opts);
    assert!(first.created());
    first.set_pods(&[(pod, 0)]);
    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    h.open(pod, 3);
    assert_eq!(first.active(0), 3);
    let ids = attached(cg.path());
    drop(first); // the "proxy" exits without detaching

    let second = open(&pins.opts); // the restarted proxy
    assert!(
        !second.created(),
        "the restarted proxy reopens the pinned set"
    );
    assert_eq!(attached(cg.path()), ids, "no second attachment");
    // A different proxy slot for the same pod: the kernel slot is reused from BACKENDS.
    second.set_pods(&[(pod, 42)]);
    assert_eq!(second.active(42), 3, "counts continue across the restart");
    h.open(pod, 2);
    assert_eq!(second.active(42), 5, "each new connection counted once");
    assert_eq!(second.kernel_loads().iter().sum::<u64>(), 5);
    h.close(5);
    assert_eq!(second.active(42), 0);
}

#[test]
fn two_processes_share_one_pinned_set() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let (_l1, pod1) = listener();
    let (_l2, pod2) = listener();

    let a = open(&pins.opts);
    let b = open(&pins.opts);
    assert!(a.created() && !b.created());
    // Each "proxy" numbers the pods its own way.
    a.set_pods(&[(pod1, 0), (pod2, 1)]);
    b.set_pods(&[(pod2, 5), (pod1, 9)]);
    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    h.open(pod1, 2);
    h.open(pod2, 1);
    assert_eq!((a.active(0), a.active(1)), (2, 1));
    assert_eq!(
        (b.active(9), b.active(5)),
        (2, 1),
        "the second proxy sees the same node-wide load"
    );
    assert_eq!(attached(cg.path()).len(), 1);

    // b forgets pod2; a still routes to it (a will re-add it on its next rebuild).
    b.set_pods(&[(pod1, 9)]);
    assert_eq!(b.active(5), 0, "an unlisted slot reads zero");
    a.set_pods(&[(pod1, 0), (pod2, 1)]);
    assert_eq!(a.active(0), 2);
}

#[test]
fn sigkilled_holder_leaves_no_phantom_load() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    let (_l, pod) = listener();
    gauge.set_pods(&[(pod, 3)]);
    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    h.open(pod, 4);
    assert_eq!(gauge.active(3), 4);
    h.kill();
    assert_eq!(
        wait_for(0, SETTLE, || gauge.active(3)),
        0,
        "a killed process's connections stop counting"
    );
    assert!(gauge.kernel_loads().iter().all(|&v| v == 0));
}

#[test]
fn open_without_bpffs_fails_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("flexinfer-not-bpffs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmpdir");
    let opts = EbpfOptions {
        bpffs: dir.clone(),
        pin_dir: dir.join("flexinfer"),
        ..EbpfOptions::default()
    };
    let result = EbpfGauge::open(&opts);
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Err(e @ EbpfError::NoBpffs { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&dir.display().to_string()) && msg.contains("not a bpf filesystem"),
                "{msg}"
            );
        }
        Err(EbpfError::NotEmbedded) if !ebpf_required() => {
            flexinfer_tests::skip(
                "this build embeds no eBPF object (run `cargo xtask build-ebpf`)",
            );
        }
        Err(e) => panic!("expected NoBpffs, got {e:?}"),
        Ok(_) => panic!("open succeeded on a directory that is not bpffs"),
    }
}

#[test]
fn detach_removes_pins_and_the_attachment() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    assert_eq!(attached(cg.path()).len(), 1);
    assert!(pins::set_dir(&pins.opts.pin_dir)
        .join(pins::LINK_PIN)
        .exists());
    drop(gauge);
    cli::detach(&pins.opts).expect("detach");
    assert!(!pins.opts.pin_dir.exists(), "pin dir removed");
    assert_eq!(
        wait_for(0, SETTLE, || attached(cg.path()).len()),
        0,
        "no sock_ops program left on the cgroup"
    );
    // And a detached set is not silently reopened by status.
    assert!(cli::status_to(&pins.opts, &mut Vec::new()).is_err());
}

#[test]
fn detach_also_removes_the_pins_of_earlier_layouts() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    drop(gauge);
    // Stand-ins for the pins older builds wrote at the top of the pin dir (the connection-count
    // layout, the sk_msg redirect): any BPF object pinned under those names.
    let dir = &pins.opts.pin_dir;
    {
        let set = pins::PinnedSet::open_existing(dir).expect("reopen");
        for name in pins::LEGACY_PINS {
            pins::map_data(&set.backends)
                .pin(dir.join(name))
                .expect("pin a legacy name");
        }
        // The extra files do not stop this build from reopening the set.
        drop(set);
        pins::PinnedSet::open_existing(dir).expect("reopen with legacy pins");
    }
    let removed = pins::remove_pins(dir).expect("detach");
    for name in pins::LEGACY_PINS {
        assert!(removed.files.contains(&dir.join(name)), "{name} removed");
    }
    assert!(removed.dir_removed, "pin dir removed");
    assert_eq!(
        wait_for(0, SETTLE, || attached(cg.path()).len()),
        0,
        "no sock_ops program left on the cgroup"
    );
}

/// A node whose pins use the previous layout (a connection-count set at the top of the pin
/// dir, attached) is upgraded in place: the old set is detached and removed, the new one is
/// created under its versioned directory, and exactly one program stays attached.
#[test]
fn an_earlier_layout_is_replaced_in_place() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let old = TestPins::new(&cg);
    let pins = TestPins::new(&cg);
    // An attached set, moved to where the previous layout kept its pins (LOAD was its array).
    drop(open(&old.opts));
    let from = pins::set_dir(&old.opts.pin_dir);
    let to = &pins.opts.pin_dir;
    std::fs::create_dir_all(to).unwrap();
    for (a, b) in [
        (pins::LINK_PIN, pins::LINK_PIN),
        ("BACKENDS", "BACKENDS"),
        ("CONNS", "CONNS"),
        ("PODS", "LOAD"),
    ] {
        std::fs::rename(from.join(a), to.join(b)).expect("move a pin");
    }
    assert_eq!(attached(cg.path()).len(), 1, "the old layout is attached");
    assert!(
        cli::status_to(&pins.opts, &mut Vec::new())
            .unwrap_err()
            .to_string()
            .contains("earlier layout"),
        "status names the old layout"
    );
    let gauge = open(&pins.opts);
    assert!(gauge.created(), "a new set was created");
    assert_eq!(
        wait_for(1, SETTLE, || attached(cg.path()).len()),
        1,
        "old link detached, new one attached"
    );
    let left: Vec<_> = std::fs::read_dir(to)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        left,
        [routing_common::LAYOUT],
        "only the versioned set remains"
    );
    let (_l, pod) = listener();
    gauge.set_pods(&[(pod, 0)]);
    let mut holder = Holder::spawn(Path::new(HOLDER), &cg);
    holder.open(pod, 2);
    assert_eq!(gauge.active(0), 2, "the new set counts");
    drop(holder);
    assert_eq!(wait_for(0, SETTLE, || gauge.active(0)), 0);
}

#[test]
fn every_test_cleans_up_after_itself() {
    if !bpf_or_skip() {
        return;
    }
    let path;
    let pin_dir;
    {
        let cg = test_cgroup();
        let pins = TestPins::new(&cg);
        let g = open(&pins.opts);
        let (_l, pod) = listener();
        g.set_pods(&[(pod, 0)]);
        path = cg.path().to_path_buf();
        pin_dir = pins.opts.pin_dir.clone();
        // guards drop here: pins first (declared later), then the cgroup
    }
    assert!(!pin_dir.exists(), "{} still pinned", pin_dir.display());
    assert!(!path.exists(), "{} still exists", path.display());
}

#[test]
fn ipv6_and_v4_mapped_pods_are_counted() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    let l6 = TcpListener::bind("[::1]:0").expect("bind [::1]");
    let pod6 = l6.local_addr().expect("addr");
    let (_l4, pod4) = listener();
    gauge.set_pods(&[(pod6, 1), (pod4, 2)]);
    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    h.open(pod6, 2);
    // An AF_INET6 socket to ::ffff:127.0.0.1 is the IPv4 pod.
    let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{}", pod4.port())
        .parse()
        .expect("mapped");
    h.open(mapped, 3);
    assert_eq!((gauge.active(1), gauge.active(2)), (2, 3));
    h.close(5);
    assert_eq!((gauge.active(1), gauge.active(2)), (0, 0));
}

#[test]
fn a_cgroup_that_is_not_cgroup2_is_refused_and_leaves_nothing_pinned() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    // A directory that is not a cgroup is refused before anything loads.
    let mut pins = TestPins::new(&cg);
    let not_cgroup = std::env::temp_dir();
    pins.opts.cgroup = Some(not_cgroup.clone());
    match EbpfGauge::open(&pins.opts) {
        Err(e @ EbpfError::NotCgroup2 { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&not_cgroup.display().to_string()), "{msg}");
            assert!(msg.contains("mount -t cgroup2"), "{msg}");
        }
        Err(e) => panic!("expected NotCgroup2, got {e:?}"),
        Ok(_) => panic!("attaching to a non-cgroup directory succeeded"),
    }
    assert_nothing_left(&pins.opts.pin_dir);
    // The next open (with a real cgroup) starts clean and works. (A refused program, which
    // fails after maps were made, leaves nothing either: tests/tests/it/ebpf_load.rs.)
    pins.opts.cgroup = Some(cg.path().to_path_buf());
    let gauge = open(&pins.opts);
    assert!(gauge.created());
}

fn assert_nothing_left(pin_dir: &Path) {
    assert!(
        !pin_dir.exists(),
        "left behind after a failed open: {:?}",
        std::fs::read_dir(pin_dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}

const PROBE: &str = env!("CARGO_BIN_EXE_gauge-probe");

fn probe(pins: &TestPins, cg: &Cgroup, pods: &[SocketAddr]) -> String {
    let out = std::process::Command::new(PROBE)
        .arg(&pins.opts.pin_dir)
        .arg(cg.path())
        .args(pods.iter().map(|p| p.to_string()))
        .output()
        .expect("run gauge-probe");
    assert!(
        out.status.success(),
        "gauge-probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

#[test]
fn a_second_process_sees_the_same_load() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let gauge = open(&pins.opts);
    let (_l1, pod1) = listener();
    let (_l2, pod2) = listener();
    gauge.set_pods(&[(pod1, 0), (pod2, 1)]);
    let mut h = Holder::spawn(Path::new(HOLDER), &cg);
    h.open(pod1, 3);
    h.open(pod2, 1);
    // Another process, numbering the pods the other way round.
    let out = probe(&pins, &cg, &[pod2, pod1]);
    assert_eq!(out, "created=false\nactive=1,3\n");
    assert_eq!(attached(cg.path()).len(), 1);
}

#[test]
fn processes_starting_together_attach_once() {
    if !bpf_or_skip() {
        return;
    }
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let (_l, pod) = listener();
    let mut children: Vec<std::process::Child> = (0..4)
        .map(|_| {
            std::process::Command::new(PROBE)
                .arg(&pins.opts.pin_dir)
                .arg(cg.path())
                .arg("--wait")
                .arg(pod.to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn gauge-probe")
        })
        .collect();
    // Release them all at once.
    for c in &mut children {
        use std::io::Write;
        c.stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("release probe");
    }
    let mut created = 0;
    for c in children {
        let out = c.wait_with_output().expect("probe output");
        assert!(out.status.success(), "probe failed");
        if String::from_utf8_lossy(&out.stdout).contains("created=true") {
            created += 1;
        }
    }
    assert_eq!(created, 1, "exactly one process creates the pinned set");
    assert_eq!(attached(cg.path()).len(), 1, "and it is attached once");
}
