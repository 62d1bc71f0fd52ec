//! The proxy image run the way the chart's DaemonSet runs it.
//!
//! The image is built once per test process by the same code as `cargo xtask image`, from the
//! binary every other test runs, on the debootstrap base (no registry here); it is tagged by a
//! hash of that binary and the Dockerfile, so an unchanged build is reused across runs. A pod is
//! the chart rendered with per-test values and translated to podman flags the way the kubelet
//! would apply them: the proxy container's command, env, privilege, hostPath mounts with their
//! propagation, memory limit, host network, and its grace period for `stop`.
//!
//! The "node" is a child cgroup of the cgroup2 root: containers run beneath it
//! (`--cgroup-parent`), and the chart's cgroup2 hostPath points at it, so the proxies attach
//! `sock_ops` there and see every connection of every pod on that node, as they would at the
//! root of a real node, without seeing the rest of this machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xtask::container::{self as engine_support, Engine, Prebuilt, LOCAL_BASE};

use crate::chart::{chart_dir, documents, render};
use crate::ebpf::{bpf_or_skip, ebpf_required};
use crate::{free_port, get, loopback, proxy_bin};

/// Name prefix of everything these tests create (containers, cgroups, pin dirs).
const PREFIX: &str = "flexinfer-ctest";

/// Podman, or `None` (after recording a skip with the reason) when the test should skip. BPF is
/// needed too. With FLEXINFER_REQUIRE_EBPF set and root, a missing podman is a failure, not a
/// skip.
pub fn podman_or_skip() -> Option<Engine> {
    if !bpf_or_skip() {
        return None;
    }
    match Engine::podman() {
        Ok(e) => Some(e),
        Err(e) if ebpf_required() => {
            panic!(
                "{}: containers required (FLEXINFER_REQUIRE_EBPF, root) but {e:#}; `cargo xtask test` installs podman",
                flexinfer_test_support::running_test()
            )
        }
        Err(e) => {
            flexinfer_test_support::skip(&format!(
                "{e:#} (set FLEXINFER_REQUIRE_EBPF=1 to fail instead)"
            ));
            None
        }
    }
}

fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{PREFIX}-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The proxy image for this test process (built at most once).
pub fn test_image(engine: &Engine) -> String {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| build_test_image(engine).map_err(|e| format!("{e:#}")))
        .clone()
        .unwrap_or_else(|e| panic!("building the test image: {e}"))
}

fn build_test_image(engine: &Engine) -> anyhow::Result<String> {
    remove_leftovers(engine);
    let t = Instant::now();
    engine_support::ensure_local_base(engine)?;
    let binary = proxy_bin();
    let mut bytes = std::fs::read(&binary)?;
    bytes.extend(std::fs::read(engine_support::dockerfile())?);
    let tag = format!(
        "localhost/flexinfer-proxy-test:{:016x}",
        xxhash_rust::xxh3::xxh3_64(&bytes)
    );
    if engine.image_exists(&tag) {
        eprintln!("container tests: reusing {tag}");
        return Ok(tag);
    }
    let version = xtask::paths::chart_app_version()?;
    engine_support::build_prebuilt(
        engine,
        &Prebuilt {
            binary: &binary,
            tag: &tag,
            base: Some(LOCAL_BASE),
            version: &version,
        },
    )?;
    eprintln!(
        "container tests: built {tag} from {} in {:.1}s",
        binary.display(),
        t.elapsed().as_secs_f64()
    );
    // Older test images are dead weight; one in use by another run is refused, which is fine.
    if let Ok(list) = engine.run(&[
        "images",
        "--format",
        "{{.Repository}}:{{.Tag}}",
        "localhost/flexinfer-proxy-test",
    ]) {
        for old in list.lines().filter(|l| *l != tag && !l.is_empty()) {
            let _ = engine.run(&["rmi", old]);
        }
    }
    Ok(tag)
}

/// Containers of test processes that died without cleaning up (SIGKILL, a crash).
fn remove_leftovers(engine: &Engine) {
    let Ok(names) = engine.run(&["ps", "-a", "--format", "{{.Names}}"]) else {
        return;
    };
    for name in names.lines() {
        let pid = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.rsplit('-').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = engine.run(&["rm", "-f", "-t", "0", name]);
            }
        }
    }
}

/// Every cgroup hierarchy mounted here (v1 controllers and the v2 root).
fn cgroup_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "cgroup" | "cgroup2").then(|| PathBuf::from(dir))
        })
        .collect()
}

/// The test's node: a child cgroup of the cgroup2 root that its containers run beneath.
/// Removed on drop from every hierarchy podman created it in (after the containers are gone).
pub struct NodeCgroup {
    pub name: String,
    /// The cgroup2 directory (the chart's cgroup2 hostPath in these tests).
    pub path: PathBuf,
}

impl NodeCgroup {
    pub fn new() -> Self {
        let root = routing_userspace::ebpf::cgroup::cgroup2_root().expect("cgroup2 mount");
        let name = unique("node");
        let path = root.join(&name);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { name, path }
    }

    /// The number of sock_ops programs attached to this cgroup.
    pub fn sock_ops_attached(&self) -> usize {
        let dir = std::fs::File::open(&self.path).expect("open cgroup");
        routing_userspace::ebpf::sys::sock_ops_attached(&dir)
            .expect("query sock_ops")
            .len()
    }
}

impl Default for NodeCgroup {
    fn default() -> Self {
        Self::new()
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for mount in cgroup_mounts() {
            let dir = mount.join(&self.name);
            while dir.exists() {
                remove_tree(&dir);
                if Instant::now() > deadline {
                    eprintln!("cleanup: {} is still busy", dir.display());
                    break;
                }
                if dir.exists() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

/// Where the chart's bpffs hostPath points, on the host and in the pod.
const HOST_BPFFS: &str = "/sys/fs/bpf";

/// A pin directory of its own under /sys/fs/bpf, removed (which detaches) on drop.
pub struct PinDir(pub PathBuf);

impl PinDir {
    /// Mounts bpffs at /sys/fs/bpf first if the host has none, as every real node has: a
    /// container started before that would mount a bpffs of its own, whose pins the host (and
    /// the other pods) never see.
    pub fn new() -> Self {
        let root = PathBuf::from(HOST_BPFFS);
        routing_userspace::ebpf::sys::mount_bpffs_once(&root)
            .unwrap_or_else(|e| panic!("mounting bpffs at {HOST_BPFFS} on the host: {e}"));
        Self(root.join(unique("pins")))
    }
}

impl Default for PinDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = routing_userspace::ebpf::pins::remove_pins(&self.0) {
            eprintln!("cleanup of {}: {e}", self.0.display());
        }
    }
}

/// One host mount of the pod spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: String,
    pub container: String,
    pub read_only: bool,
    /// `mountPropagation`: None, HostToContainer or Bidirectional.
    pub propagation: Option<String>,
}

impl Mount {
    /// The podman `-v` argument, with the kubelet's meaning of `mountPropagation`.
    pub fn volume_arg(&self) -> String {
        let mut opts = Vec::new();
        if self.read_only {
            opts.push("ro");
        }
        match self.propagation.as_deref() {
            Some("Bidirectional") => opts.push("rshared"),
            Some("HostToContainer") => opts.push("rslave"),
            _ => {}
        }
        if opts.is_empty() {
            format!("{}:{}", self.host, self.container)
        } else {
            format!("{}:{}:{}", self.host, self.container, opts.join(","))
        }
    }
}

/// The pod address the container tests stand in for `status.podIP` (host network, loopback).
pub const POD_IP: &str = "127.0.0.1";

/// The proxy container of the rendered DaemonSet, as the kubelet would run it.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub privileged: bool,
    pub host_network: bool,
    pub mounts: Vec<Mount>,
    pub memory_limit: Option<String>,
    pub grace: Duration,
}

impl PodTemplate {
    pub fn from_rendered(docs: &[Value]) -> Self {
        let ds = docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet")
            .expect("a DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        let c = pod["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| c["name"] == "proxy")
            .expect("the proxy container");
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().expect("a string").to_owned())
                .collect()
        };
        // As the kubelet does: the downward API's pod IP (the node's address on hostNetwork,
        // loopback here), namespace and pod name, and `$(NAME)` references to earlier
        // variables.
        let mut env: Vec<(String, String)> = Vec::new();
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().expect("env name").to_owned();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.podIP") => POD_IP.to_owned(),
                // The release namespace the container tests render with.
                Some("metadata.namespace") => "flexinfer-system".to_owned(),
                // No fleet is counted here (no API server): the name only ranks a counted pod.
                Some("metadata.name") => "flexinfer-proxy-test".to_owned(),
                Some(other) => panic!("no stand-in for the downward API field {other}"),
                None => {
                    let mut v = e["value"]
                        .as_str()
                        .expect("env values are literal")
                        .to_owned();
                    for (k, val) in &env {
                        v = v.replace(&format!("$({k})"), val);
                    }
                    v
                }
            };
            env.push((name, value));
        }
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        let mounts = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let v = volumes
                    .iter()
                    .find(|v| v["name"] == m["name"])
                    .unwrap_or_else(|| panic!("no volume for {m}"));
                Mount {
                    host: v["hostPath"]["path"]
                        .as_str()
                        .expect("hostPath volumes only")
                        .to_owned(),
                    container: m["mountPath"].as_str().expect("mountPath").to_owned(),
                    read_only: m["readOnly"] == true,
                    propagation: m["mountPropagation"].as_str().map(str::to_owned),
                }
            })
            .collect();
        Self {
            command: strings(&c["command"]),
            env,
            privileged: c["securityContext"]["privileged"] == true,
            host_network: pod["hostNetwork"] == true,
            mounts,
            memory_limit: c["resources"]["limits"]["memory"]
                .as_str()
                .map(str::to_owned),
            grace: Duration::from_secs(
                pod["terminationGracePeriodSeconds"]
                    .as_u64()
                    .expect("terminationGracePeriodSeconds"),
            ),
        }
    }

    /// The env value the chart set.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `memory: 512Mi` -> podman's `512m` (binary units either way).
fn podman_memory(q: &str) -> String {
    for (suffix, unit) in [("Ki", "k"), ("Mi", "m"), ("Gi", "g")] {
        if let Some(n) = q.strip_suffix(suffix) {
            return format!("{n}{unit}");
        }
    }
    q.to_owned()
}

/// Where the models file lives inside the container (a read-only directory mount, so the
/// proxy sees the test's atomic rewrites).
pub const CONFIG_DIR: &str = "/etc/flexinfer";

/// One pod of the chart's DaemonSet on the test's node.
pub struct Pod {
    engine: Engine,
    pub name: String,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub template: PodTemplate,
}

/// Everything a pod needs from its test.
pub struct PodSetup<'a> {
    pub engine: &'a Engine,
    pub image: &'a str,
    pub node: &'a NodeCgroup,
    pub pins: &'a PinDir,
    /// A directory holding `models.yaml`, mounted at [`CONFIG_DIR`].
    pub config_dir: &'a Path,
}

impl Pod {
    /// Render the chart for this node and start its proxy pod; waits for /readyz like the
    /// readiness probe does. The chart values are the defaults except: host network and
    /// loopback ports (the test's sims are on loopback), the cgroup2 hostPath set to the test
    /// node's cgroup, file discovery (no API server here) with debug decision logs, and the pin
    /// directory through `extraEnv`.
    pub async fn start(s: &PodSetup<'_>) -> Pod {
        let (http, admin) = (free_port(), free_port());
        let values = json!({
            "hostNetwork": true,
            "proxy": {
                "bindAddress": "127.0.0.1",
                "ports": {"http": http, "admin": admin},
                "discovery": "file",
                "logLevel": "info,routing_userspace=debug",
                "ebpf": {"cgroup2HostPath": s.node.path.display().to_string()},
                "extraEnv": [
                    {"name": "FLEXINFER_PROXY_CONFIG", "value": format!("{CONFIG_DIR}/models.yaml")},
                    {"name": "FLEXINFER_PROXY_CONFIG_POLL", "value": "100ms"},
                    {"name": "FLEXINFER_PROXY_BPF_PIN_DIR", "value": s.pins.0.display().to_string()},
                ],
            },
        });
        let rendered =
            render(&chart_dir(), "flexinfer-proxy", "flexinfer-system", values).expect("render");
        let template = PodTemplate::from_rendered(&documents(&rendered).expect("parse"));
        let name = unique("pod");
        let mut cmd = s.engine.command();
        cmd.args(["run", "--detach", "--name", &name])
            .arg(format!("--cgroup-parent=/{}", s.node.name))
            .arg(format!(
                "--entrypoint={}",
                serde_json::to_string(&template.command).unwrap()
            ))
            .arg(format!("--stop-timeout={}", template.grace.as_secs()));
        if template.privileged {
            cmd.arg("--privileged");
        }
        if template.host_network {
            cmd.args(["--network", "host"]);
        }
        if let Some(m) = &template.memory_limit {
            cmd.arg(format!("--memory={}", podman_memory(m)));
        }
        for m in &template.mounts {
            cmd.arg("--volume").arg(m.volume_arg());
        }
        cmd.arg("--volume")
            .arg(format!("{}:{CONFIG_DIR}:ro", s.config_dir.display()));
        for (k, v) in &template.env {
            cmd.arg("--env").arg(format!("{k}={v}"));
        }
        cmd.arg(s.image);
        let out = cmd.stdin(Stdio::null()).output().expect("podman run");
        assert!(
            out.status.success(),
            "podman run failed: {}\n{cmd:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pod = Pod {
            engine: s.engine.clone(),
            name,
            addr: loopback(http),
            admin: loopback(admin),
            template,
        };
        pod.wait_ready(Duration::from_secs(30)).await;
        pod
    }

    async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = get(self.admin, "/readyz").await {
                if r.status == 200 {
                    return;
                }
            }
            let running = self.state("{{.State.Running}}");
            assert!(
                running == "true" && Instant::now() < deadline,
                "pod {} not ready (running: {running}):\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn podman(&self, args: &[&str]) -> Output {
        self.engine
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("podman")
    }

    /// A field of `podman inspect` (a Go template).
    pub fn state(&self, format: &str) -> String {
        let out = self.podman(&["inspect", "--format", format, &self.name]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The container's output (the proxy logs to stderr).
    pub fn logs(&self) -> String {
        let out = self.podman(&["logs", &self.name]);
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// `kubectl exec`: a command inside the running container.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut a = vec!["exec", self.name.as_str()];
        a.extend_from_slice(args);
        self.podman(&a)
    }

    /// The proxy's pid on the host.
    pub fn host_pid(&self) -> u32 {
        self.state("{{.State.Pid}}").parse().expect("a pid")
    }

    /// SIGKILL (a node-level kill: OOM, `kill -9`, a crashed runtime).
    pub fn sigkill(&self) {
        let out = self.podman(&["kill", "--signal", "KILL", &self.name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What the kubelet does on pod deletion: SIGTERM (the image's STOPSIGNAL), SIGKILL after
    /// the grace period. Returns how long the container took to exit.
    pub fn stop(&self) -> Duration {
        let t = Instant::now();
        let grace = self.template.grace.as_secs().to_string();
        let out = self.podman(&["stop", "--time", &grace, &self.name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        t.elapsed()
    }

    pub fn exit_code(&self) -> Option<i64> {
        self.state("{{.State.ExitCode}}").parse().ok()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}
