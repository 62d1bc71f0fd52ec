//! Where a bench or soak run leaves its evidence, and the markdown it prints.
//!
//! Every run gets a fresh directory `<base>/<unix time>/` (base is under the cargo target dir,
//! e.g. `<target>/bench-overhead`), stamped with the command line that made it and the versions
//! of the tools it ran, so a table pasted into the docs can be traced back to its raw output.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// A run's output directory.
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Create `<base>/<unix seconds>` (with `-<n>` appended if a run of the same second has it).
    pub fn create(base: &Path) -> io::Result<Self> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(io::Error::other)?
            .as_secs();
        std::fs::create_dir_all(base)?;
        let mut path = base.join(secs.to_string());
        let mut n = 1;
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    path = base.join(format!("{secs}-{n}"));
                    n += 1;
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", path.display()),
                    ))
                }
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` inside the run directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> io::Result<()> {
        let p = self.file(name);
        std::fs::write(&p, contents)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", p.display())))
    }

    /// `command.txt` (this process's command line as `cargo xtask ...`) and `versions.txt`.
    pub fn stamp(&self, versions: &str) -> io::Result<()> {
        self.write("command.txt", format!("{}\n", command_line()))?;
        self.write("versions.txt", versions)
    }
}

/// This process's arguments as the `cargo xtask ...` command that runs it.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo xtask {}", args.join(" "))
}

/// The first line a command prints (stdout, else stderr: `nginx -v` writes there), or why it
/// could not run.
pub fn first_line(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| {
            let t = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            t.lines().next().unwrap_or_default().to_string()
        })
        .unwrap_or_else(|e| format!("unavailable: {e}"))
}

/// `kernel: ...`, one `<name>: <first line>` per tool (a program and its version flag), and
/// `git: <commit> <subject>` of the repository at `repo`.
pub fn versions(tools: &[(&str, &[&str])], repo: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kernel: {}",
        first_line(Command::new("uname").arg("-sr"))
    );
    for (name, argv) in tools {
        if let Some((prog, args)) = argv.split_first() {
            let _ = writeln!(s, "{name}: {}", first_line(Command::new(prog).args(args)));
        }
    }
    let _ = writeln!(s, "git: {}", git_head(repo));
    s
}

/// `<short commit> <subject>` of HEAD in `repo`, `+ uncommitted changes` when the tree is dirty.
pub fn git_head(repo: &Path) -> String {
    let head =
        first_line(
            Command::new("git")
                .current_dir(repo)
                .args(["log", "-1", "--format=%h %s"]),
        );
    let dirty = Command::new("git")
        .current_dir(repo)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{head} (+ uncommitted changes)")
    } else {
        head
    }
}

/// The date and time now, `YYYY-MM-DD HH:MM UTC`.
pub fn date_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// `v` with `digits` decimals, or `-` when it is not a number (no sample).
pub fn fixed(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "-".into()
    }
}

/// A markdown table: a header row, then rows of cells (`|` inside a cell is escaped).
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row; missing cells are left empty, extra ones dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        let mut r: Vec<String> = cells.into_iter().map(Into::into).collect();
        r.resize(self.header.len(), String::new());
        self.rows.push(r);
        self
    }

    pub fn render(&self) -> String {
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            format!("| {} |\n", cells.join(" | "))
        };
        let mut t = line(&self.header);
        t.push_str(&format!("|{}\n", " --- |".repeat(self.header.len())));
        for r in &self.rows {
            t.push_str(&line(r));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_render_as_markdown() {
        let mut t = Table::new(["a", "b"]);
        t.row(["1", "x|y"]).row(["2"]);
        assert_eq!(
            t.render(),
            "| a | b |\n| --- | --- |\n| 1 | x\\|y |\n| 2 |  |\n"
        );
        assert_eq!(fixed(1.23456, 2), "1.23");
        assert_eq!(fixed(f64::NAN, 2), "-");
    }

    #[test]
    fn run_dirs_are_fresh_and_stamped() {
        let tmp = crate::TempDir::new("rundir");
        let a = RunDir::create(&tmp.path().join("bench")).unwrap();
        let b = RunDir::create(&tmp.path().join("bench")).unwrap();
        assert_ne!(a.path(), b.path());
        a.stamp("kernel: x\n").unwrap();
        let cmd = std::fs::read_to_string(a.file("command.txt")).unwrap();
        assert!(cmd.starts_with("cargo xtask "), "{cmd}");
        assert_eq!(
            std::fs::read_to_string(a.file("versions.txt")).unwrap(),
            "kernel: x\n"
        );
        let v = versions(&[("sh", &["sh", "-c", "echo 1.2"])], tmp.path());
        assert!(v.starts_with("kernel: ") && v.contains("sh: 1.2\n"), "{v}");
    }
}
