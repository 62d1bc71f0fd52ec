//! Embed the eBPF object if one was built (`cargo xtask build-ebpf`), else embed nothing.
//!
//! A plain `cargo build` on a machine without nightly or bpf-linker must still work; the
//! binary then reports at run time that eBPF is not built in and uses the userspace gauge.
//! The object comes from `FLEXINFER_EBPF_OBJECT`, or from `<target>/bpf/routing-ebpf.o`
//! (the stable path xtask writes), found by walking up from OUT_DIR.

use std::path::{Path, PathBuf};

const OBJECT_NAME: &str = "routing-ebpf.o";

fn main() {
    println!("cargo:rerun-if-env-changed=FLEXINFER_EBPF_OBJECT");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = match std::env::var_os("FLEXINFER_EBPF_OBJECT") {
        Some(p) => {
            let p = PathBuf::from(p);
            println!("cargo:rerun-if-changed={}", p.display());
            Some(p)
        }
        None => stable_object(&out_dir),
    };
    let dest = out_dir.join(OBJECT_NAME);
    match source.filter(|p| p.is_file()) {
        Some(src) => {
            std::fs::copy(&src, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
        }
        None => {
            std::fs::write(&dest, []).expect("writing the empty object placeholder");
        }
    }
}

/// `<target>/bpf/routing-ebpf.o`, where `<target>` is the ancestor of OUT_DIR that holds the
/// `build` directory. The `bpf` directory is created (empty) if missing so cargo can watch it:
/// a rebuilt object changes it and re-runs this script.
fn stable_object(out_dir: &Path) -> Option<PathBuf> {
    let target = out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))?
        .parent()?
        .ancestors()
        .find(|a| a.join("bpf").is_dir() || a.join("CACHEDIR.TAG").is_file())?
        .to_path_buf();
    let bpf_dir = target.join("bpf");
    let _ = std::fs::create_dir_all(&bpf_dir);
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    Some(bpf_dir.join(OBJECT_NAME))
}
