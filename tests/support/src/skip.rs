//! Skips a test runner can count. libtest has no "skipped" result: a test that returns early
//! passes, and what it printed is captured. So a test that cannot run here (no BPF, no podman,
//! no Prometheus) records why with [`skip`]: a marker file in `$FLEXINFER_SKIP_DIR`, which
//! `cargo xtask test` sets, counts apart from the passes and lists by name; and a banner written
//! straight to stderr (libtest does not capture that), for a plain `cargo test`.
//!
//! One file per skip rather than a marker line in the output: tests run on parallel threads and
//! libtest writes its own lines in pieces, so a line could land inside another; a file stays
//! whole whatever runs beside it, and needs no parsing of the harness's output.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The directory `cargo xtask test` collects skip markers in.
pub const SKIP_DIR_ENV: &str = "FLEXINFER_SKIP_DIR";

/// Marker files end in this, so a reader ignores anything else in the directory.
const MARKER_EXT: &str = "skip";

/// One test that did not run, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    /// The test binary (`it`), without cargo's hash suffix.
    pub binary: String,
    /// The test's name as libtest reports it (`ebpf_gauge::counts_connections_...`).
    pub test: String,
    pub reason: String,
}

impl Skipped {
    /// Three lines: binary, test, reason (the reason may continue over more lines).
    fn to_text(&self) -> String {
        format!("{}\n{}\n{}\n", self.binary, self.test, self.reason)
    }

    fn from_text(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '\n');
        let binary = parts.next()?.to_owned();
        let test = parts.next()?.to_owned();
        let reason = parts.next()?.trim_end().to_owned();
        (!binary.is_empty() && !test.is_empty()).then_some(Self {
            binary,
            test,
            reason,
        })
    }
}

/// The running test's name. libtest runs every test on a thread named after it (the full
/// path, `module::test`), also with `--test-threads=1`, and a `#[tokio::test]` body is polled
/// on that thread; anything else is not a test thread.
pub fn running_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "<not a test thread>".to_owned(),
    }
}

/// This test binary's name without cargo's `-<hash>` suffix.
fn binary_name() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let stem = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    strip_hash(&stem).to_owned()
}

/// `it-0123456789abcdef` -> `it`; anything else as it is.
fn strip_hash(stem: &str) -> &str {
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name
        }
        _ => stem,
    }
}

/// Records that the running test skips, and why; the caller then returns. Panics if
/// `$FLEXINFER_SKIP_DIR` is set but the marker cannot be written: a skip the runner cannot see
/// would count as a pass.
pub fn skip(reason: &str) {
    let s = Skipped {
        binary: binary_name(),
        test: running_test(),
        reason: reason.to_owned(),
    };
    // One write, straight to the process's stderr: not captured, and not split by other threads.
    let banner = format!(
        "\n== SKIPPED {} ({}): {}\n== this test did NOT run; `cargo xtask test` counts it as skipped\n",
        s.test, s.binary, s.reason
    );
    let _ = io::stderr().lock().write_all(banner.as_bytes());
    if let Some(dir) = std::env::var_os(SKIP_DIR_ENV) {
        write_marker(Path::new(&dir), &s).unwrap_or_else(|e| {
            panic!(
                "{}: cannot record the skip in {SKIP_DIR_ENV}={}: {e}",
                s.test,
                Path::new(&dir).display()
            )
        });
    }
}

/// Writes `s` as a new marker file in `dir` (unique within the machine: binary, PID, sequence).
pub fn write_marker(dir: &Path, s: &Skipped) -> io::Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "{}-{}-{}.{MARKER_EXT}",
        s.binary,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let path = dir.join(name);
    std::fs::write(&path, s.to_text())?;
    Ok(path)
}

/// Every marker in `dir`, sorted by binary and test; none if the directory does not exist.
pub fn read_markers(dir: &Path) -> io::Result<Vec<Skipped>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == MARKER_EXT) {
            let text = std::fs::read_to_string(&path)?;
            let s = Skipped::from_text(&text).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a skip marker: {text:?}", path.display()),
                )
            })?;
            out.push(s);
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TempDir;

    #[test]
    fn markers_round_trip_and_other_files_are_ignored() {
        let dir = TempDir::new("skip-markers");
        let a = Skipped {
            binary: "it".into(),
            test: "ebpf_gauge::counts".into(),
            reason: "not running as root\n(set FLEXINFER_REQUIRE_EBPF=1)".into(),
        };
        let b = Skipped {
            binary: "it".into(),
            test: "container::serves".into(),
            reason: "podman missing".into(),
        };
        write_marker(dir.path(), &a).unwrap();
        write_marker(dir.path(), &b).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a marker").unwrap();
        assert_eq!(read_markers(dir.path()).unwrap(), vec![b, a]);
        std::fs::write(dir.path().join("broken.skip"), "only one line").unwrap();
        assert!(
            read_markers(dir.path()).is_err(),
            "a broken marker is an error"
        );
        assert_eq!(
            read_markers(&dir.path().join("absent")).unwrap(),
            Vec::new()
        );
    }

    #[test]
    fn the_test_name_is_the_thread_libtest_runs_it_on() {
        assert_eq!(
            running_test(),
            "skip::tests::the_test_name_is_the_thread_libtest_runs_it_on"
        );
        let other = std::thread::spawn(running_test).join().unwrap();
        assert_eq!(other, "<not a test thread>");
    }

    #[test]
    fn cargo_hash_suffixes_are_stripped() {
        assert_eq!(strip_hash("it-0123456789abcdef"), "it");
        assert_eq!(strip_hash("ebpf_gauge-fdd5930c52f7f7cf"), "ebpf_gauge");
        assert_eq!(strip_hash("conn-holder"), "conn-holder");
        assert_eq!(strip_hash("it"), "it");
    }
}
