//! The results of one `cargo test` run, read from its output (stdout and stderr merged, in
//! the order they were written), so the closing line counts what really happened.
//!
//! libtest's `test result:` lines alone would miss two outcomes: a test binary that dies
//! (signal, abort, `exit`) prints none, and a build that fails runs nothing at all. Cargo
//! announces every binary on stderr (`Running ...`, `Doc-tests ...`) before it starts it, so a
//! binary announced without a result line is one that crashed; cargo's `could not compile`
//! line names each target that did not build; and a failed run that left no such trace at all
//! still counts once, so a red run never closes with `0 failed`.

/// One test binary that ended without its result line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Crash {
    /// What cargo announced: `tests/it/main.rs (target/debug/deps/it-0123...)`.
    pub binary: String,
    /// Cargo's account of its exit (`signal: 6, SIGABRT: process abort signal`), if it gave one.
    pub reason: Option<String>,
}

/// The results of a `cargo test` run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Summary {
    pub passed: u64,
    /// Failed tests, as libtest counted them.
    pub failed: u64,
    pub ignored: u64,
    pub crashed: Vec<Crash>,
    /// Cargo's `could not compile ...` lines.
    pub build_failures: Vec<String>,
    /// Set when cargo failed but nothing above says why.
    pub unexplained: Option<String>,
    /// The binary announced last and not yet closed by its result line.
    running: Option<String>,
    /// `process didn't exit successfully: `<path>` (<reason>)`, per executable path.
    exits: Vec<(String, String)>,
}

impl Summary {
    /// Reads every line of a run, then its exit status (what [`Summary::line`] and
    /// [`Summary::finish`] do as the lines arrive).
    #[cfg(test)]
    pub(super) fn read<'a>(lines: impl IntoIterator<Item = &'a str>, success: bool) -> Self {
        let mut s = Summary::default();
        for l in lines {
            s.line(l);
        }
        s.finish(success);
        s
    }

    /// Feeds one line of output.
    pub(super) fn line(&mut self, line: &str) {
        let t = line.trim();
        if let Some(binary) = t
            .strip_prefix("Running ")
            .or_else(|| t.strip_prefix("Doc-tests "))
        {
            self.close_crashed();
            self.running = Some(binary.to_owned());
        } else if let Some(rest) = t.strip_prefix("test result: ") {
            self.running = None;
            self.add_counts(rest);
        } else if let Some(rest) = t.strip_prefix("process didn't exit successfully: `") {
            if let Some((path, reason)) = rest.split_once("` (") {
                let reason = reason.strip_suffix(')').unwrap_or(reason);
                self.exits.push((path.to_owned(), reason.to_owned()));
            }
        } else if t.starts_with("error: could not compile ") {
            self.build_failures
                .push(t.trim_start_matches("error: ").to_owned());
        }
    }

    /// The end of the output: the last binary may have crashed, and a failed run must show a
    /// failure.
    pub(super) fn finish(&mut self, success: bool) {
        self.close_crashed();
        for c in &mut self.crashed {
            // Cargo announces `desc (target/debug/deps/it-<hash>)` but reports the exit of the
            // absolute path: the executable's file name ties them.
            c.reason = self
                .exits
                .iter()
                .find(|(path, _)| {
                    let exe = path.rsplit('/').next().unwrap_or(path);
                    c.binary.ends_with(&format!("/{exe})"))
                })
                .map(|(_, reason)| reason.clone());
        }
        if !success && self.failures() == 0 {
            self.unexplained = Some("cargo test failed, but no test, binary or build did".into());
        }
    }

    /// Everything that failed: tests, crashed binaries, targets that did not build, and a
    /// failed run with no other trace.
    pub(super) fn failures(&self) -> u64 {
        self.failed
            + self.crashed.len() as u64
            + self.build_failures.len() as u64
            + u64::from(self.unexplained.is_some())
    }

    /// A line per crashed binary, target that did not build, and unexplained failure.
    pub(super) fn failure_lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .crashed
            .iter()
            .map(|c| match &c.reason {
                Some(r) => format!("crashed (no test result): {} ({r})", c.binary),
                None => format!("crashed (no test result): {}", c.binary),
            })
            .collect();
        out.extend(
            self.build_failures
                .iter()
                .map(|b| format!("build failed: {b}")),
        );
        out.extend(self.unexplained.clone());
        out
    }

    fn close_crashed(&mut self) {
        if let Some(binary) = self.running.take() {
            self.crashed.push(Crash {
                binary,
                reason: None,
            });
        }
    }

    /// `ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.3s`.
    fn add_counts(&mut self, rest: &str) {
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
