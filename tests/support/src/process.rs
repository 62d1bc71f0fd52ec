//! A child process that cannot outlive its owner: killed (or terminated with a grace period)
//! when the guard drops, its output kept in a log file for the failure message.
#![allow(unsafe_code)] // see the SAFETY lines

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running child process. stdout and stderr go to a log file; stdin is closed.
///
/// On drop it is SIGKILLed and reaped, or, after [`Proc::graceful`], sent SIGTERM and given
/// that long to exit first (daemons such as nginx must stop their own workers).
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    grace: Option<Duration>,
}

impl Proc {
    /// Start `cmd` (named `name` in messages) with its output in `log` (created or truncated).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> io::Result<Self> {
        let out = std::fs::File::create(log)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", log.display())))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {name} ({cmd:?}): {e}")))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            grace: None,
        })
    }

    /// Stop with SIGTERM and up to `grace` to exit (then SIGKILL) when dropped.
    pub fn graceful(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the process wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status if the process has exited (it is reaped then), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then wait up to `timeout` for the exit; `None` if it is still running.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited() {
            return Some(s);
        }
        // SAFETY: kill(2) on our own, not yet reaped child: the PID cannot have been reused.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }

    /// CPU time (user + system, every thread) used so far by the process and its live
    /// descendants (an nginx master and its workers, say). A benchmark divides the difference
    /// over a run by the requests served to get the CPU cost of one request.
    pub fn cpu_time(&self) -> Duration {
        tree_cpu_time(self.child.id())
    }
}

/// utime + stime of `pid` and of every process below it, from /proc.
pub(crate) fn tree_cpu_time(pid: u32) -> Duration {
    // SAFETY: sysconf has no side effects.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as u64,
        _ => 100,
    };
    let mut ticks = 0u64;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            ticks += stat_cpu_ticks(&stat).unwrap_or(0);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted from its closing parenthesis.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is f[11], stime f[12].
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(grace) = self.grace {
            if self.terminate(grace).is_some() {
                return;
            }
            eprintln!(
                "{} ({}) still running {grace:?} after SIGTERM; killing it",
                self.name,
                self.child.id()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TempDir;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn output_goes_to_the_log_and_the_exit_is_seen() {
        let dir = TempDir::new("proc-log");
        let mut p =
            Proc::spawn("echo", sh("echo out; echo err >&2"), &dir.path().join("l")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(s) = p.exited() {
                break s;
            }
            assert!(Instant::now() < deadline, "sh did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success());
        let log = p.log_text();
        assert!(log.contains("out") && log.contains("err"), "{log:?}");
    }

    #[test]
    fn cpu_time_counts_the_process_and_its_children() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 7 9 20 0 1 0 5 0 0";
        assert_eq!(
            stat_cpu_ticks(line),
            Some(280),
            "utime 250 + stime 30, children's not"
        );
        assert_eq!(stat_cpu_ticks("garbage"), None);

        let dir = TempDir::new("proc-cpu");
        // A shell whose child spins (for 5 s at most): the time is the child's, seen through
        // the parent.
        let p = Proc::spawn(
            "spin",
            sh("timeout 5 sh -c 'while :; do :; done' & wait"),
            &dir.path().join("l"),
        )
        .unwrap()
        .graceful(Duration::from_secs(1));
        let t0 = p.cpu_time();
        std::thread::sleep(Duration::from_millis(600));
        let used = p.cpu_time() - t0;
        assert!(used >= Duration::from_millis(100), "{used:?}");
        // Stop the spinner now rather than at its timeout (it is the shell's child).
        let _ = Command::new("pkill")
            .arg("-P")
            .arg(p.pid().to_string())
            .status();
    }

    #[test]
    fn drop_kills_and_graceful_drop_lets_sigterm_run_its_handler() {
        let dir = TempDir::new("proc-drop");
        let marker = dir.path().join("terminated");
        let script = format!(
            "trap 'echo bye > {}; exit 0' TERM; while :; do sleep 0.05; done",
            marker.display()
        );
        let p = Proc::spawn("loop", sh(&script), &dir.path().join("a")).unwrap();
        let pid = p.pid();
        drop(p);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped on drop"
        );
        assert!(!marker.exists(), "a plain drop is SIGKILL: no handler runs");

        let p = Proc::spawn("loop", sh(&script), &dir.path().join("b"))
            .unwrap()
            .graceful(Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(200)); // let the shell install its trap
        drop(p);
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "bye");
    }
}
