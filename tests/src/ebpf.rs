//! Harness for tests of the eBPF gauge: BPF availability, a child cgroup and pin dir per test
//! (from `flexinfer-test-support`), and a connection-holding helper process.
//!
//! Each test gets its own child cgroup and pin directory, both cleaned up on drop, so tests
//! run in parallel without seeing each other's connections and leave nothing attached or
//! pinned. Connections are made by `conn-holder` processes started inside the child cgroup
//! (cgroup v2 membership is per process), so the test process itself never changes cgroup.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub use flexinfer_test_support::{bpf_missing, Cgroup, PinDir};
use routing_userspace::ebpf::EbpfOptions;

/// Whether eBPF must be tested (CI sets `FLEXINFER_REQUIRE_EBPF=1`).
pub fn ebpf_required() -> bool {
    std::env::var_os("FLEXINFER_REQUIRE_EBPF").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `true` if the test should run. Panics when BPF is missing but required; otherwise records a
/// skip with the reason ([`flexinfer_test_support::skip`]), which the runner counts.
pub fn bpf_or_skip() -> bool {
    match bpf_missing() {
        None => true,
        Some(why) if ebpf_required() => panic!(
            "{}: eBPF required (FLEXINFER_REQUIRE_EBPF) but {why}",
            flexinfer_test_support::running_test()
        ),
        Some(why) => {
            flexinfer_test_support::skip(&format!(
                "{why} (set FLEXINFER_REQUIRE_EBPF=1 to fail instead)"
            ));
            false
        }
    }
}

/// Prefix of the cgroups and pin dirs the tests create (`<prefix>-<pid>-<n>`).
const PREFIX: &str = "flexinfer-test";

/// A fresh child cgroup of the cgroup2 root for one test, removed on drop.
pub fn test_cgroup() -> Cgroup {
    Cgroup::create(PREFIX).unwrap_or_else(|e| panic!("test cgroup: {e}"))
}

/// Options with a pin directory of their own, attaching to `cgroup`; everything pinned there
/// is removed on drop.
pub struct TestPins {
    pub opts: EbpfOptions,
    _dir: PinDir,
}

impl TestPins {
    pub fn new(cgroup: &Cgroup) -> Self {
        let dir = PinDir::new(PREFIX);
        let opts = EbpfOptions {
            cgroup: Some(cgroup.path().to_path_buf()),
            pin_dir: dir.path().to_path_buf(),
            ..EbpfOptions::default()
        };
        Self { opts, _dir: dir }
    }
}

/// The `conn-holder` helper process, running inside a cgroup. Killed on drop.
pub struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    /// Start the helper (binary at `exe`) as a member of `cgroup`.
    pub fn spawn(exe: &Path, cgroup: &Cgroup) -> Self {
        let mut cmd = Command::new(exe);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cgroup.spawn_inside(&mut cmd).spawn().unwrap_or_else(|e| {
            panic!(
                "spawning {} in {}: {e}",
                exe.display(),
                cgroup.path().display()
            )
        });
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send one command; returns the value after `ok` (panics on `err`).
    fn command(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("holder stdin");
        self.stdin.flush().expect("holder stdin");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("holder stdout");
        let line = line.trim();
        match line.strip_prefix("ok") {
            Some(v) => v.trim().to_string(),
            None => panic!("holder answered {line:?} to {cmd:?}"),
        }
    }

    /// Open `n` connections to `addr` and hold them.
    pub fn open(&mut self, addr: SocketAddr, n: usize) {
        self.command(&format!("open {addr} {n}"));
    }

    /// Close the `n` oldest connections.
    pub fn close(&mut self, n: usize) {
        self.command(&format!("close {n}"));
    }

    /// SIGKILL the helper and reap it.
    pub fn kill(mut self) {
        self.child.kill().expect("kill holder");
        self.child.wait().expect("reap holder");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `f` until it returns `want` or `timeout` passes; returns the last value seen. Only for
/// effects the kernel applies asynchronously (a killed process's sockets closing).
pub fn wait_for<T: PartialEq + Copy>(want: T, timeout: Duration, mut f: impl FnMut() -> T) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let v = f();
        if v == want || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Flags that point a proxy's eBPF gauge at the test's cgroup and pins (and make it fatal
/// when eBPF does not load).
pub fn ebpf_flags(pins: &TestPins) -> Vec<String> {
    vec![
        "--gauge".into(),
        "ebpf".into(),
        "--require-ebpf".into(),
        "--cgroup-path".into(),
        pins.opts.cgroup.as_ref().unwrap().display().to_string(),
        "--bpf-pin-dir".into(),
        pins.opts.pin_dir.display().to_string(),
    ]
}

/// Every pod of the pinned set, as `ebpf status` reads it.
pub fn kernel_pods(pins: &TestPins) -> Vec<routing_userspace::ebpf::cli::PodLoad> {
    let set = routing_userspace::ebpf::pins::PinnedSet::open_existing(&pins.opts.pin_dir)
        .expect("pinned set");
    routing_userspace::ebpf::cli::pod_loads(&set).expect("read pods")
}

/// The load least-loaded reads for `pod` (requests in flight + unregistered connections).
pub fn kernel_load(pins: &TestPins, pod: SocketAddr) -> u64 {
    kernel_pods(pins)
        .into_iter()
        .find(|p| p.addr == pod)
        .map_or(0, |p| p.active)
}
