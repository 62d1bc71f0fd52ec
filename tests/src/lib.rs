//! Shared support for the workspace integration tests: real `flexinfer-proxy` processes (proxy
//! and `sim` replicas) on loopback, and a small async HTTP client.
//!
//! The process, scratch-dir, port, cgroup, pin-dir and models-file plumbing lives in
//! `flexinfer-test-support` (shared with `cargo xtask bench`) and is re-exported here.
//! Processes are killed when their handle drops, so a failing test leaves nothing running.

/// Misbehaving backends: fixed 5xx, never answering, dropping SYNs.
pub mod backends;
pub mod chart;
/// The proxy image and pods of the chart's DaemonSet, run with podman.
pub mod container;
/// eBPF test harness: child cgroups, pin dirs, connection-holding helper processes.
pub mod ebpf;
/// A pod that records the trace headers it gets (the tracing tests).
pub mod header_pod;
/// A local OTLP/HTTP traces receiver (the tracing tests).
pub mod otlp;
pub mod prom;
/// Waiting until a proxy routes by the models file a test rewrote.
pub mod reload;
/// Custom resources checked against their CRD's openAPIV3Schema.
pub mod schema;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub use flexinfer_test_support::{
    free_port, loopback, running_test, skip, ModelEntry, ModelsFile, Proc, TempDir,
};

/// The `flexinfer-proxy` binary: `FLEXINFER_PROXY_BIN`, else next to this test's target dir.
/// `cargo test --workspace` builds it first (routing-userspace has integration tests of its
/// own, which makes cargo build its binary); `cargo test -p flexinfer-tests` does not, so a
/// binary older than a source file of the proxy is refused rather than tested.
pub fn proxy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FLEXINFER_PROXY_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/flexinfer-proxy
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = profile_dir.join("flexinfer-proxy");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build -p routing-userspace) or set FLEXINFER_PROXY_BIN",
        bin.display()
    );
    if let Some(src) = newer_source(&bin) {
        panic!(
            "{} is older than {}: it does not run the code under test; build it first \
             (cargo build -p routing-userspace --bin flexinfer-proxy) or set FLEXINFER_PROXY_BIN",
            bin.display(),
            src.display()
        );
    }
    bin
}

/// A source file of the proxy (routing-userspace, routing-common) modified after `bin` was
/// built: the binary does not run that code. (Not the library's `.rlib`: the tests and the
/// binary may link differently featured builds of it, one legitimately newer than the other.)
fn newer_source(bin: &Path) -> Option<PathBuf> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let built = modified(bin)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let mut dirs: Vec<PathBuf> = ["routing-userspace/src", "routing-common/src"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if modified(&path).is_some_and(|m| m > built) {
                return Some(path);
            }
        }
    }
    None
}

/// An `env` entry that is not passed on: the proxy starts under this open-files limit (soft
/// and hard), as under a container runtime's, through util-linux's `prlimit`.
pub const NOFILE_LIMIT: &str = "<open-files limit>";

fn spawn(name: &str, args: &[String], env: &HashMap<String, String>, log: PathBuf) -> Proc {
    let mut env = env.clone();
    let mut cmd = match env.remove(NOFILE_LIMIT) {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg("--")
                .arg(proxy_bin());
            c
        }
        None => Command::new(proxy_bin()),
    };
    cmd.args(args).envs(&env);
    Proc::spawn(name, cmd, &log).unwrap_or_else(|e| panic!("{e}"))
}

/// Wait until `GET url` answers 200.
pub async fn wait_ok(addr: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(r) = get(addr, path).await {
            if r.status == StatusCode::OK {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("{addr}{path} not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A simulated replica (`flexinfer-proxy sim`).
pub struct Sim {
    pub name: String,
    pub addr: SocketAddr,
    pub proc: Proc,
}

impl Sim {
    /// Waits until this sim is generating exactly `n` requests (`sim_requests_in_flight`), so a
    /// test that stops something mid-request knows its request is there. Panics after 10 s.
    pub async fn wait_in_flight(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = get(self.addr, "/metrics").await.map(|r| r.text());
            let now = text
                .as_deref()
                .ok()
                .and_then(|t| metric_value(t, "sim_requests_in_flight", &[]));
            if now == Some(n as f64) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sim {}: {now:?} requests in flight after 10 s, want {n}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Start a sim named `name` with extra flags, and wait for /health.
pub async fn start_sim(name: &str, extra: &[&str], dir: &Path) -> Sim {
    let addr = loopback(free_port());
    let mut args = vec![
        "sim".to_string(),
        "--listen".into(),
        addr.to_string(),
        "--name".into(),
        name.to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let proc = spawn(
        &format!("sim {name}"),
        &args,
        &HashMap::new(),
        dir.join(format!("sim-{name}.log")),
    );
    wait_ok(addr, "/health", Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("sim {name}: {e}"));
    Sim {
        name: name.into(),
        addr,
        proc,
    }
}

/// A running proxy with its models file.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config: PathBuf,
    pub proc: Proc,
}

impl Proxy {
    /// Replace the models file and wait until `/debug/routing` shows it applied. Panics if the
    /// proxy refuses the file, or has not applied it within 10 s (its poll is 100 ms).
    pub async fn rewrite_config(&self, models: &ModelsFile) {
        let refused = self.refusals();
        models.write_to(&self.config).expect("swap config");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let view = get(self.admin, "/debug/routing")
                .await
                .expect("debug view")
                .json();
            let differs = match reload::view_shows(&view, models) {
                Ok(()) => return,
                Err(why) => why,
            };
            assert_eq!(
                self.refusals(),
                refused,
                "the proxy refused the new models file:\n{}",
                self.proc.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "the proxy has not applied the new models file after 10 s: {differs}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Replace the models file with one the proxy must refuse, and wait until it says so in
    /// its log (it keeps routing by the last good table).
    pub async fn rewrite_config_refused(&self, models: &ModelsFile) {
        let refused = self.refusals();
        models.write_to(&self.config).expect("swap config");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.refusals() == refused {
            assert!(
                Instant::now() < deadline,
                "no {:?} within 10 s:\n{}",
                reload::REFUSED_LINE,
                self.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// How many rewritten models files the proxy has refused so far.
    fn refusals(&self) -> usize {
        self.proc.log_text().matches(reload::REFUSED_LINE).count()
    }

    pub async fn metrics(&self) -> String {
        get(self.admin, "/metrics").await.expect("metrics").text()
    }
}

/// Start a proxy on `models` with extra flags and environment, and wait for /readyz.
///
/// Ports come from [`free_port`], which a busy test machine can hand to an outgoing connection
/// before the proxy binds it; a proxy that could not listen is started again on fresh ports
/// (up to three times). Any other early exit fails the test with the proxy's log.
pub async fn start_proxy(
    models: &ModelsFile,
    extra: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
) -> Proxy {
    for attempt in 1.. {
        match try_start_proxy(models, extra, env, dir).await {
            Ok(p) => return p,
            Err(log) if attempt < 3 && log.contains("cannot listen on") => continue,
            Err(log) => panic!("proxy exited before it was ready:\n{log}"),
        }
    }
    unreachable!("the loop returns or panics")
}

async fn try_start_proxy(
    models: &ModelsFile,
    extra: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
) -> Result<Proxy, String> {
    let config = dir.join(format!("models-{}.yaml", free_port()));
    models.write_to(&config).expect("write config");
    let addr = loopback(free_port());
    let admin = loopback(free_port());
    let mut args = vec![
        "serve".to_string(),
        "--listen".into(),
        addr.to_string(),
        "--admin-listen".into(),
        admin.to_string(),
        "--config".into(),
        config.display().to_string(),
        "--config-poll".into(),
        "100ms".into(),
    ];
    // The userspace gauge unless the test picks one: most tests are about routing, not eBPF.
    if !extra.contains(&"--gauge") {
        args.extend(["--gauge".into(), "userspace".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut envs: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    envs.entry("RUST_LOG".into())
        .or_insert_with(|| "info,routing_userspace=debug".into());
    let mut proc = spawn(
        "flexinfer-proxy",
        &args,
        &envs,
        dir.join(format!("proxy-{}.log", addr.port())),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while wait_ok(admin, "/readyz", Duration::from_millis(100))
        .await
        .is_err()
    {
        if let Some(status) = proc.exited() {
            return Err(format!("({status})\n{}", proc.log_text()));
        }
        assert!(
            Instant::now() < deadline,
            "proxy not ready after 10s:\n{}",
            proc.log_text()
        );
    }
    Ok(Proxy {
        addr,
        admin,
        config,
        proc,
    })
}

/// A buffered HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// The sim replica that served this (`x-sim-pod`).
    pub fn pod(&self) -> String {
        self.header("x-sim-pod").unwrap_or("<none>").to_string()
    }
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(req: Request<Full<Bytes>>) -> anyhow::Result<Reply> {
    let resp = client().request(req).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<Reply> {
    let req = Request::get(format!("http://{addr}{path}")).body(Full::new(Bytes::new()))?;
    send(req).await
}

/// POST a JSON body with extra headers.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> anyhow::Result<Reply> {
    let mut b =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(Full::new(Bytes::from(body.to_owned())))?).await
}

/// `n` chat requests for `model` sent at once; every one must succeed. Returns how many each
/// pod (`x-sim-pod`) served.
pub async fn burst(addr: SocketAddr, model: &str, n: usize) -> HashMap<String, usize> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let body = chat_body(model, None, &format!("burst {i}"), "");
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &body).await })
        })
        .collect();
    let mut hits = HashMap::new();
    for t in tasks {
        let r = t.await.expect("request task").expect("request");
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        *hits.entry(r.pod()).or_insert(0) += 1;
    }
    hits
}

/// Unexpired least-loaded reservations over every pod of every model (`/debug/routing`).
pub async fn pending_reservations(admin: SocketAddr) -> u64 {
    let view = get(admin, "/debug/routing")
        .await
        .expect("debug view")
        .json();
    view["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["pods"].as_array().cloned().unwrap_or_default())
        .map(|p| p["reservations"].as_u64().unwrap_or(0))
        .sum()
}

/// A streamed chat request whose first SSE event has arrived: what the tests that break a
/// stream mid-way (kill its pod) hold while they break it. Killed before its first event, the
/// pod's reset would be a retryable failure before any byte, not a broken stream.
pub struct OpenStream {
    body: hyper::body::Incoming,
    /// What has arrived so far.
    pub got: Vec<u8>,
}

/// POST a streamed chat request of `max_tokens` for `model` and wait for its first event
/// (status 200).
pub async fn open_stream(addr: SocketAddr, model: &str, max_tokens: u32) -> OpenStream {
    let extra = format!(r#"{{"stream":true,"max_tokens":{max_tokens}}}"#);
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body(model, None, "s", &extra))))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = OpenStream {
        body: resp.into_body(),
        got: Vec::new(),
    };
    while !stream.got.starts_with(b"data: ") {
        let frame = stream.body.frame().await.expect("a first event").unwrap();
        if let Ok(d) = frame.into_data() {
            stream.got.extend_from_slice(&d);
        }
    }
    stream
}

impl OpenStream {
    /// Everything the stream sent, read to its end; panics if it broke instead of ending
    /// (a failure mid-stream must end it with an error event).
    pub async fn finish(mut self) -> String {
        while let Some(frame) = self.body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(d) = f.into_data() {
                        self.got.extend_from_slice(&d);
                    }
                }
                Err(e) => panic!("the stream broke instead of ending with an error event: {e}"),
            }
        }
        String::from_utf8_lossy(&self.got).into_owned()
    }
}

/// A chat body with a system prompt, a user message and optional extra top-level fields.
pub fn chat_body(model: &str, system: Option<&str>, user: &str, extra: &str) -> String {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": user}));
    let mut v = serde_json::json!({"model": model, "messages": messages, "max_tokens": 2});
    if !extra.is_empty() {
        let more: serde_json::Value = serde_json::from_str(extra).expect("extra fields are JSON");
        for (k, val) in more.as_object().expect("extra is an object") {
            v[k] = val.clone();
        }
    }
    v.to_string()
}

/// The value of one Prometheus sample line `name{labels} value`, matching every given label.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .reduce(|a, b| a + b)
}
