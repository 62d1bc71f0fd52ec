//! The peer proxies and the proxy under test, started the same way by every loopback bench
//! (`bench overhead`, `bench stream`): nginx and haproxy with one worker, flexinfer-proxy with
//! one worker thread and either `--gauge userspace` or its default flags as root, and smg from
//! PyPI. Each bench writes its own configs (they differ in balance and timeouts); this module
//! owns how a process is placed (CPU, cgroup), started, checked and stopped.
//!
//! The default-flags row runs as root with no `--gauge` flag, so the proxy loads its eBPF
//! gauge; it attaches to a child cgroup of the harness with a pin dir of its own, both removed
//! after the run (and, if a run was killed, by the next one).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::report;
use flexinfer_test_support::{http_request, pin_to_cpu, wait_http_ok, Cgroup, PinDir, Proc};

use crate::ebpf;

/// The load side (load generator and upstreams) runs here; the proxy under test alone on
/// [`PROXY_CPU`], so its rate is what one core of it serves.
pub(crate) const LOAD_CPU: usize = 0;
pub(crate) const PROXY_CPU: usize = 1;
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the benches' `fx-default` row cannot run here (it loads the eBPF gauge), as the note
/// each bench prints, or `None` where BPF works.
pub(crate) fn fx_default_unavailable() -> Option<String> {
    flexinfer_test_support::bpf_missing()
        .map(|why| format!("fx-default: not measured, it loads the eBPF gauge and {why}"))
}

/// Remove the cgroups and pin dirs a killed run with `prefix` left behind (root only).
pub(crate) fn remove_stale(prefix: &str, who: &str) {
    for p in Cgroup::remove_stale(prefix)
        .into_iter()
        .chain(PinDir::remove_stale(prefix))
    {
        eprintln!("{who}: removed {} of a run that was killed", p.display());
    }
}

/// The part of an nginx config every instance shares: pid, logs and temp paths in its own dir
/// (nginx as root otherwise writes under /var/lib/nginx), no access log, room for
/// `worker_connections` connections (the open-files limit is inherited: raise it first), every
/// queued connection accepted at each wakeup with `multi_accept` (without it nginx accepts one
/// per event loop turn, and thousands of connections opened at once wait in the listen queue
/// for seconds), and client keep-alive connections that are never closed for their request
/// count. The caller adds its `server`s and the closing `}`.
pub(crate) fn nginx_common(dir: &Path, worker_connections: u32, multi_accept: bool) -> String {
    let d = dir.display();
    let multi_accept = if multi_accept {
        " multi_accept on;"
    } else {
        ""
    };
    format!(
        r#"worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections {worker_connections};{multi_accept} }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
"#
    )
}

/// nginx with `conf` (its prefix and error log in `dir`) on `cpu`, optionally inside `cgroup`.
pub(crate) fn nginx(
    dir: &Path,
    conf: &Path,
    cpu: usize,
    cgroup: Option<&Cgroup>,
    log: &Path,
) -> Result<Proc> {
    let mut cmd = Command::new("nginx");
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(conf)
        .arg("-e")
        .arg(dir.join("error.log"));
    pin_to_cpu(&mut cmd, cpu);
    if let Some(cg) = cgroup {
        cg.spawn_inside(&mut cmd);
    }
    Ok(Proc::spawn("nginx", cmd, log)?.graceful(Duration::from_secs(5)))
}

/// haproxy in the foreground with `conf`, on [`PROXY_CPU`].
pub(crate) fn haproxy(conf: &Path, log: &Path) -> Result<Proc> {
    let mut cmd = Command::new("haproxy");
    cmd.args(["-db", "-f"]).arg(conf);
    pin_to_cpu(&mut cmd, PROXY_CPU);
    Ok(Proc::spawn("haproxy", cmd, log)?.graceful(Duration::from_secs(5)))
}

/// Which gauge flexinfer-proxy runs with.
#[derive(Clone, Copy)]
pub(crate) enum FxGauge<'a> {
    /// `--gauge userspace`.
    Userspace,
    /// No `--gauge` flag, as root: the eBPF gauge, attached to `cgroup` (the proxy runs inside
    /// it) with its pins in `pins`.
    Default {
        cgroup: &'a Cgroup,
        pins: &'a PinDir,
    },
}

/// How to start flexinfer-proxy under test.
pub(crate) struct FxLaunch<'a> {
    pub bin: &'a Path,
    pub models: &'a Path,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub gauge: FxGauge<'a>,
    /// More `serve` flags.
    pub extra: &'a [&'a str],
}

/// `flexinfer-proxy serve --worker-threads 1` on [`PROXY_CPU`], ready (`/readyz` answered 200)
/// and, for [`FxGauge::Default`], with its eBPF gauge loaded.
pub(crate) fn flexinfer(fx: &FxLaunch, log: &Path) -> Result<Proc> {
    let mut cmd = Command::new(fx.bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(fx.models)
        .args(["--listen", &fx.listen.to_string()])
        .args(["--admin-listen", &fx.admin.to_string()])
        .args(["--worker-threads", "1", "--drain-timeout", "1s"])
        // Nothing routes by its readiness here: stop without the 5 s shutdown delay.
        .args(["--shutdown-delay", "0s"])
        .args(fx.extra);
    match &fx.gauge {
        FxGauge::Userspace => {
            cmd.args(["--gauge", "userspace"]);
        }
        FxGauge::Default { cgroup, pins } => {
            cmd.arg("--cgroup-path")
                .arg(cgroup.path())
                .arg("--bpf-pin-dir")
                .arg(pins.path());
            cgroup.spawn_inside(&mut cmd);
        }
    }
    pin_to_cpu(&mut cmd, PROXY_CPU);
    let p = Proc::spawn("flexinfer-proxy", cmd, log)?.graceful(Duration::from_secs(5));
    wait_http_ok(fx.admin, "/readyz", START_TIMEOUT).with_context(|| p.log_text())?;
    if matches!(fx.gauge, FxGauge::Default { .. }) {
        let m = http_request(fx.admin, "GET", "/metrics", &[], b"")?.text();
        if !m.contains("flexinfer_proxy_ebpf_enabled 1") {
            bail!(
                "default flags as root did not load the eBPF gauge:\n{}",
                p.log_text()
            );
        }
    }
    Ok(p)
}

/// `flexinfer-proxy ebpf status` of the pins in `pins` (what the kernel side still tracks).
pub(crate) fn ebpf_status(bin: &Path, pins: &PinDir) -> Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(["ebpf", "status", "--bpf-pin-dir"])
        .arg(pins.path())
        .output()
        .context("running ebpf status")?;
    Ok(out.stdout)
}

/// nginx and haproxy as [`versions`] takes them.
pub(crate) const PEER_TOOLS: [(&str, &[&str]); 2] =
    [("nginx", &["nginx", "-v"]), ("haproxy", &["haproxy", "-v"])];

/// What goes in `versions.txt`: the kernel, `tools` (a name and the command that prints its
/// version), smg's version and the commit.
pub(crate) fn versions(tools: &[(&str, &[&str])], smg: Option<&Path>) -> String {
    let mut s = report::versions(tools, &ebpf::workspace_root());
    if let Some(p) = smg {
        let python = p.with_file_name("python3");
        let version = report::first_line(Command::new(python).args([
            "-c",
            "import importlib.metadata as m; print(m.version('smg'))",
        ]));
        let _ = writeln!(s, "smg: {version}");
    }
    s
}

/// smg from PyPI in a venv of its own under `base`: `pip download --no-deps smg`, then the
/// wheel is installed with its (small, pure-Python or prebuilt) dependencies. Idempotent.
pub(crate) fn install_smg(base: &Path) -> Result<PathBuf> {
    let root = base.join("smg");
    let venv = root.join("venv");
    let smg = venv.join("bin").join("smg");
    let works = |p: &Path| {
        Command::new(p)
            .arg("--help")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&smg) {
        return Ok(smg);
    }
    std::fs::create_dir_all(&root)?;
    let run = |cmd: &mut Command| crate::setup::run_logged("bench overhead", cmd);
    if run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).is_err() {
        crate::setup::ensure_apt(&["python3-venv"])?;
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let wheels = root.join("wheels");
    run(Command::new(venv.join("bin").join("pip"))
        .args(["download", "--no-deps", "--quiet", "smg", "-d"])
        .arg(&wheels))?;
    let wheel = std::fs::read_dir(&wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("smg-"))
                && p.extension().is_some_and(|e| e == "whl")
        })
        .context("pip download left no smg wheel")?;
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet"])
        .arg(&wheel))?;
    if !works(&smg) {
        bail!(
            "{} does not run after installing {}",
            smg.display(),
            wheel.display()
        );
    }
    Ok(smg)
}

/// Where the flexinfer rows' admin port answers, for evidence after a run.
pub(crate) fn admin_text(admin: SocketAddr, path: &str) -> Option<String> {
    http_request(admin, "GET", path, &[], b"")
        .ok()
        .map(|r| r.text())
}
