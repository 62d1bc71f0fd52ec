//! Container engines and the proxy image.
//!
//! Two engines: docker when its daemon answers (the CLI alone proves nothing: it is often
//! installed without a running engine), else podman. Podman gets three settings that make it
//! work on hosts like this project's machines and change nothing elsewhere: `--cgroup-manager
//! cgroupfs` (no systemd needed; `--cgroup-parent` takes a plain path), runc as the runtime
//! when installed (crun refuses hybrid cgroup v1/v2 layouts), and a containers.conf with
//! `default_ulimits = []` (inherit limits instead of setting them; some sandboxes refuse
//! rlimit changes).
//!
//! With no registry reachable no base image can be pulled, so the runtime stage is built on a
//! Debian minbase made with debootstrap and imported as [`LOCAL_BASE`] (kept between runs).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::paths::{target_dir, workspace_root};

/// The local Debian base (debootstrap minbase, the same release the default runtime base and
/// the builder image are made from).
pub const LOCAL_BASE: &str = "localhost/debian-base:bookworm";
/// The Debian release of [`LOCAL_BASE`].
pub const DEBIAN_SUITE: &str = "bookworm";
/// Where the chart pulls the image from; the tag is the chart's appVersion.
pub const DEFAULT_REPOSITORY: &str = "ghcr.io/flexinfer/flexinfer-proxy";
/// The Dockerfile stage that packages a binary built outside the image.
pub const PREBUILT_TARGET: &str = "runtime-prebuilt";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineChoice {
    /// docker when its daemon answers, else podman.
    Auto,
    Docker,
    Podman,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Docker,
    Podman,
}

/// A working container engine and the settings every call gets.
#[derive(Debug, Clone)]
pub struct Engine {
    pub kind: Kind,
    global: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

/// Run `cmd` with a deadline; `None` when it did not finish in time (it is killed).
fn status_within(cmd: &mut Command, timeout: Duration) -> Option<bool> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s.success()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// An executable on PATH.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// runc: on PATH, else where Debian puts it (`/usr/sbin`, often missing from a user's PATH).
fn find_runc() -> Option<PathBuf> {
    find_program("runc").or_else(|| {
        ["/usr/sbin/runc", "/sbin/runc"]
            .map(PathBuf::from)
            .into_iter()
            .find(|p| p.is_file())
    })
}

impl Engine {
    /// Pick an engine that actually works.
    pub fn detect(choice: EngineChoice) -> Result<Self> {
        let docker = || -> Result<Self> {
            let ok = status_within(
                Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]),
                Duration::from_secs(20),
            );
            match ok {
                Some(true) => Ok(Self {
                    kind: Kind::Docker,
                    global: Vec::new(),
                    env: Vec::new(),
                }),
                Some(false) => bail!("docker is installed but its engine does not answer"),
                None if find_program("docker").is_none() => bail!("docker is not installed"),
                None => bail!("docker did not answer within 20 s"),
            }
        };
        match choice {
            EngineChoice::Docker => docker(),
            EngineChoice::Podman => Self::podman(),
            EngineChoice::Auto => docker().or_else(|docker_err| {
                Self::podman().map_err(|podman_err| {
                    anyhow::anyhow!(
                        "no container engine: {docker_err:#}; {podman_err:#} \
                         (apt-get install -y podman runc, or start docker)"
                    )
                })
            }),
        }
    }

    /// Podman with the settings described in the module docs, checked with `podman info`.
    pub fn podman() -> Result<Self> {
        if find_program("podman").is_none() {
            bail!("podman is not installed");
        }
        let mut global: Vec<OsString> = vec!["--cgroup-manager".into(), "cgroupfs".into()];
        if let Some(runc) = find_runc() {
            global.push("--runtime".into());
            global.push(runc.into());
        }
        let mut env = Vec::new();
        if std::env::var_os("CONTAINERS_CONF").is_none() {
            let conf = target_dir().join("containers").join("containers.conf");
            let text = "# Written by xtask: inherit rlimits instead of setting them.\n[containers]\ndefault_ulimits = []\n";
            if std::fs::read_to_string(&conf).ok().as_deref() != Some(text) {
                std::fs::create_dir_all(conf.parent().expect("has a parent"))
                    .with_context(|| format!("creating {}", conf.display()))?;
                std::fs::write(&conf, text)
                    .with_context(|| format!("writing {}", conf.display()))?;
            }
            env.push(("CONTAINERS_CONF".into(), conf.into()));
        }
        let engine = Self {
            kind: Kind::Podman,
            global,
            env,
        };
        match status_within(engine.command().arg("info"), Duration::from_secs(60)) {
            Some(true) => Ok(engine),
            Some(false) => bail!("`podman info` fails"),
            None => bail!("`podman info` did not answer within 60 s"),
        }
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Docker => "docker",
            Kind::Podman => "podman",
        }
    }

    /// The engine's command with its global settings; add the subcommand.
    pub fn command(&self) -> Command {
        let mut c = Command::new(self.name());
        c.args(&self.global);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Run a subcommand to completion, failing with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} {args:?}", self.name()))?;
        if !out.status.success() {
            bail!(
                "{} {args:?} failed ({}): {}",
                self.name(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn image_exists(&self, image: &str) -> bool {
        self.command()
            .args(["image", "inspect", "--format", "{{.Id}}", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Whether `image` is here or can be pulled now (the registry probe).
    pub fn can_get(&self, image: &str) -> bool {
        self.image_exists(image)
            || status_within(
                self.command().args(["pull", "--quiet", image]),
                Duration::from_secs(120),
            ) == Some(true)
    }

    /// The image's size in bytes, as the engine reports it.
    pub fn image_size(&self, image: &str) -> Result<u64> {
        let out = self.run(&["image", "inspect", "--format", "{{.Size}}", image])?;
        out.trim()
            .parse()
            .with_context(|| format!("image size {out:?}"))
    }
}

/// The default of `ARG NAME=...` in the Dockerfile (the single place base images are named).
pub fn dockerfile_arg(name: &str) -> Result<String> {
    let path = dockerfile();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("ARG ")?
                .strip_prefix(name)?
                .strip_prefix('=')
        })
        .map(|v| v.trim().trim_matches('"').to_owned())
        .with_context(|| format!("{} has no `ARG {name}=`", path.display()))
}

pub fn dockerfile() -> PathBuf {
    workspace_root().join("Dockerfile")
}

/// The first `URIs:` of the deb822 stanza that serves `suite` (else a `deb` line of a
/// one-line sources.list).
pub fn mirror_from_sources(deb822: &str, legacy: &str, suite: &str) -> Option<String> {
    for stanza in deb822.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim().to_owned())
            })
        };
        let is_deb = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let serves = field("Suites").is_some_and(|s| s.split_whitespace().any(|s| s == suite));
        if is_deb && serves {
            if let Some(uri) =
                field("URIs").and_then(|u| u.split_whitespace().next().map(str::to_owned))
            {
                return Some(uri);
            }
        }
    }
    legacy.lines().find_map(|l| {
        // `deb [options] URI SUITE COMPONENTS...`; comments and deb-src lines do not match.
        let rest = l.trim().strip_prefix("deb ")?.trim_start();
        let rest = match rest.strip_prefix('[') {
            Some(opts) => &opts[opts.find(']')? + 1..],
            None => rest,
        };
        let mut w = rest.split_whitespace();
        let uri = w.next()?;
        (w.next() == Some(suite)).then(|| uri.to_owned())
    })
}

/// The Debian mirror this machine's apt uses for [`DEBIAN_SUITE`].
pub fn debian_mirror() -> Result<String> {
    let deb822_path = "/etc/apt/sources.list.d/debian.sources";
    let deb822 = std::fs::read_to_string(deb822_path).unwrap_or_default();
    let legacy = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    mirror_from_sources(&deb822, &legacy, DEBIAN_SUITE).with_context(|| {
        format!("no Debian mirror for {DEBIAN_SUITE} in {deb822_path} or /etc/apt/sources.list")
    })
}

/// Make [`LOCAL_BASE`] unless the engine already has it: debootstrap a minbase rootfs and
/// import it. Needs root and debootstrap.
pub fn ensure_local_base(engine: &Engine) -> Result<()> {
    if engine.image_exists(LOCAL_BASE) {
        println!("image: {LOCAL_BASE} present");
        return Ok(());
    }
    if find_program("debootstrap").is_none() {
        bail!("debootstrap is not installed (apt-get install -y debootstrap)");
    }
    let mirror = debian_mirror()?;
    let rootfs = target_dir().join("debian-base-rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)
            .with_context(|| format!("removing the leftover {}", rootfs.display()))?;
    }
    let t = Instant::now();
    println!(
        "image: debootstrap --variant=minbase {DEBIAN_SUITE} {} {mirror}",
        rootfs.display()
    );
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", DEBIAN_SUITE])
        .arg(&rootfs)
        .arg(&mirror)
        .stdin(Stdio::null())
        .output()
        .context("running debootstrap")?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&rootfs);
        bail!(
            "debootstrap failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .chain(String::from_utf8_lossy(&out.stderr).lines())
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let result = import_rootfs(engine, &rootfs, LOCAL_BASE);
    let _ = std::fs::remove_dir_all(&rootfs);
    result?;
    println!(
        "image: {LOCAL_BASE} made in {:.0}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `tar -C rootfs -c . | <engine> import - image`.
fn import_rootfs(engine: &Engine, rootfs: &Path, image: &str) -> Result<()> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("running tar")?;
    let stdout = tar.stdout.take().expect("piped stdout");
    let import = engine
        .command()
        .args(["import", "-", image])
        .stdin(stdout)
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {} import", engine.name()))?;
    let tar_status = tar.wait()?;
    if !tar_status.success() || !import.success() {
        bail!(
            "importing {} as {image} failed (tar {tar_status}, import {import})",
            rootfs.display()
        );
    }
    Ok(())
}

/// A binary built outside the image, packaged by the Dockerfile's [`PREBUILT_TARGET`] stage.
pub struct Prebuilt<'a> {
    pub binary: &'a Path,
    pub tag: &'a str,
    /// `RUNTIME_BASE`; `None` keeps the Dockerfile's default.
    pub base: Option<&'a str>,
    pub version: &'a str,
}

/// Build the image from a prebuilt binary. The build context is a directory holding only the
/// binary (debug info stripped when objcopy is there), so nothing else is sent to the engine.
pub fn build_prebuilt(engine: &Engine, p: &Prebuilt<'_>) -> Result<()> {
    let ctx = target_dir()
        .join("image-context")
        .join(p.tag.replace(['/', ':'], "_"));
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx).with_context(|| format!("clearing {}", ctx.display()))?;
    }
    std::fs::create_dir_all(&ctx).with_context(|| format!("creating {}", ctx.display()))?;
    let dest = ctx.join("flexinfer-proxy");
    let stripped = find_program("objcopy").is_some_and(|objcopy| {
        Command::new(objcopy)
            .arg("--strip-debug")
            .arg(p.binary)
            .arg(&dest)
            .status()
            .is_ok_and(|s| s.success())
    });
    if !stripped {
        std::fs::copy(p.binary, &dest)
            .with_context(|| format!("copying {} into the build context", p.binary.display()))?;
    }
    let mut cmd = engine.command();
    cmd.arg("build")
        .arg("--file")
        .arg(dockerfile())
        .args(["--target", PREBUILT_TARGET, "--tag", p.tag])
        .arg("--build-arg")
        .arg(format!("VERSION={}", p.version))
        .arg("--build-arg")
        .arg("BINARY=flexinfer-proxy");
    if let Some(base) = p.base {
        cmd.arg("--build-arg").arg(format!("RUNTIME_BASE={base}"));
    }
    let out = cmd.arg(&ctx).stdin(Stdio::null()).output();
    let _ = std::fs::remove_dir_all(&ctx);
    let out = out.with_context(|| format!("running {} build", engine.name()))?;
    if !out.status.success() {
        bail!(
            "{} build failed ({}):\n{}{}",
            engine.name(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `<image> --version` through the image's own entrypoint: the binary runs on its base.
pub fn smoke_test(engine: &Engine, image: &str) -> Result<String> {
    let out = engine.run(&["run", "--rm", "--network", "none", image, "--version"])?;
    Ok(out.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_from_deb822_picks_the_stanza_of_the_suite() {
        let deb822 = "Types: deb\n# a comment\nURIs: http://deb.example.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://security.example.org/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirror_from_sources(deb822, "", "bookworm").as_deref(),
            Some("http://deb.example.org/debian")
        );
        assert_eq!(
            mirror_from_sources(deb822, "", "bookworm-security").as_deref(),
            Some("http://security.example.org/debian-security")
        );
        assert_eq!(mirror_from_sources(deb822, "", "trixie"), None);
    }

    #[test]
    fn mirror_from_a_one_line_sources_list() {
        let legacy = "# deb http://old.example.org/debian bookworm main\ndeb-src http://src.example.org/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://deb.example.org/debian bookworm main\n";
        assert_eq!(
            mirror_from_sources("", legacy, "bookworm").as_deref(),
            Some("http://deb.example.org/debian")
        );
    }

    #[test]
    fn the_dockerfile_names_its_bases() {
        assert!(dockerfile_arg("RUNTIME_BASE")
            .unwrap()
            .contains("distroless"));
        assert!(dockerfile_arg("RUST_IMAGE").unwrap().contains("rust:"));
        assert!(dockerfile_arg("NO_SUCH_ARG").is_err());
    }
}
