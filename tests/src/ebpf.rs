//! Harness for tests of the eBPF gauge: BPF availability, child cgroups, pin dirs, and a
//! connection-holding helper process.
//!
//! Each test gets its own child cgroup and pin directory, both cleaned up on drop, so tests
//! run in parallel without seeing each other's connections and leave nothing attached or
//! pinned. Connections are made by `conn-holder` processes started inside the child cgroup
//! (cgroup v2 membership is per process), so the test process itself never changes cgroup.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use routing_userspace::ebpf::{cgroup, pins, EbpfOptions};

/// Why BPF cannot be used here, or `None` if it can.
pub fn bpf_missing() -> Option<String> {
    // SAFETY: geteuid has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    // A tiny BPF_MAP_CREATE (array, 4-byte key and value, 1 entry) proves the syscall works.
    let mut attr = [0u32; 30];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Some(format!(
            "bpf() syscall unavailable: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: closing the descriptor the kernel just returned to us.
    unsafe { libc::close(fd as i32) };
    if cgroup::cgroup2_root().is_err() {
        return Some("no cgroup2 mount".into());
    }
    None
}

/// Whether eBPF must be tested (CI sets `FLEXINFER_REQUIRE_EBPF=1`).
pub fn ebpf_required() -> bool {
    std::env::var_os("FLEXINFER_REQUIRE_EBPF").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `true` if the test should run. Panics when BPF is missing but required; otherwise prints
/// why it skips.
pub fn bpf_or_skip(test: &str) -> bool {
    match bpf_missing() {
        None => true,
        Some(why) if ebpf_required() => {
            panic!("{test}: eBPF required (FLEXINFER_REQUIRE_EBPF) but {why}")
        }
        Some(why) => {
            eprintln!("SKIP {test}: {why} (set FLEXINFER_REQUIRE_EBPF=1 to fail instead)");
            false
        }
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A child cgroup of the cgroup2 root, removed on drop.
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    pub fn new() -> Self {
        let root = cgroup::cgroup2_root().expect("cgroup2 mount");
        let path = root.join(unique("flexinfer-test"));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }

    /// PIDs currently in the cgroup.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Default for TestCgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Holders are killed by their own guards first; retry briefly while they are reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Options with a pin directory of its own; everything pinned there is removed on drop.
pub struct TestPins {
    pub opts: EbpfOptions,
}

impl TestPins {
    pub fn new(cgroup: &TestCgroup) -> Self {
        let opts = EbpfOptions {
            cgroup: Some(cgroup.path.clone()),
            pin_dir: PathBuf::from("/sys/fs/bpf").join(unique("flexinfer-test")),
            ..EbpfOptions::default()
        };
        Self { opts }
    }
}

impl Drop for TestPins {
    fn drop(&mut self) {
        if let Err(e) = pins::remove_pins(&self.opts.pin_dir) {
            eprintln!("cleanup of {}: {e}", self.opts.pin_dir.display());
        }
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
    pub fn spawn(exe: &Path, cgroup: &Path) -> Self {
        let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes())
            .expect("path without NUL");
        let mut cmd = Command::new(exe);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (open, write, close) on memory prepared before fork.
        unsafe {
            cmd.pre_exec(move || {
                // Writing "0" to cgroup.procs moves the writing process itself.
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {} in {}: {e}", exe.display(), cgroup.display()));
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
