//! `cargo xtask setup`: install what the eBPF build and tests need on a fresh machine.
//!
//! Every step checks first and skips what is present, so running it again costs seconds.
//! bpf-linker is linked against the nightly toolchain's own libLLVM (the distribution's LLVM
//! is too old for current bpf-linker); if that fails, an older bpf-linker that loads rustc's
//! LLVM at run time is installed instead (slower to build, same result).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::ebpf::nightly;

#[derive(clap::Args)]
pub(crate) struct Setup {
    /// Skip apt packages (bpftool).
    #[arg(long)]
    pub no_apt: bool,
}

/// Where option 1 puts the `libLLVM.so` symlink bpf-linker's build looks for.
const LLVM_PREFIX: &str = "/opt/rust-llvm";
/// The fallback bpf-linker (loads rustc's LLVM dynamically).
const FALLBACK_BPF_LINKER: &str = "0.10.4";

pub(crate) fn run(args: &Setup) -> Result<()> {
    ensure_ebpf_toolchain()?;
    if !args.no_apt {
        ensure_apt(&["bpftool"])?;
    }
    println!("setup: done");
    Ok(())
}

/// What building the eBPF object needs: the nightly toolchain, its rust-src and bpf-linker
/// (`cargo xtask build-ebpf` runs this first, so it works alone on a fresh machine).
pub(crate) fn ensure_ebpf_toolchain() -> Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    println!("setup: {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn rustup() -> Command {
    let mut c = Command::new("rustup");
    c.env_remove("RUSTUP_TOOLCHAIN");
    c
}

pub(crate) fn ensure_nightly() -> Result<()> {
    let nightly = nightly();
    let list = output(rustup().args(["toolchain", "list"]))?;
    if list.lines().any(|l| l.starts_with(&nightly)) {
        println!("setup: {nightly} toolchain present");
        return Ok(());
    }
    run_cmd(rustup().args(["toolchain", "install", &nightly, "--profile", "minimal"]))
}

fn ensure_rust_src() -> Result<()> {
    let nightly = nightly();
    let installed =
        output(rustup().args(["component", "list", "--toolchain", &nightly, "--installed"]))?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("setup: rust-src ({nightly}) present");
        return Ok(());
    }
    run_cmd(rustup().args(["component", "add", "rust-src", "--toolchain", &nightly]))
}

fn nightly_sysroot() -> Result<PathBuf> {
    let s = output(
        Command::new("rustc")
            .env_remove("RUSTUP_TOOLCHAIN")
            .arg(format!("+{}", nightly()))
            .args(["--print", "sysroot"]),
    )?;
    Ok(PathBuf::from(s.trim()))
}

/// bpf-linker runs inside `cargo +nightly`, where rustup puts the toolchain's lib directory
/// (with libLLVM) on the loader path; check it the same way.
fn bpf_linker_works(sysroot: &Path) -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .env("LD_LIBRARY_PATH", sysroot.join("lib"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The nightly's shared libLLVM (`libLLVM.so.22.1-rust-...` or `libLLVM-22-rust-....so`) and its
/// major version, read from the file name.
pub(crate) fn find_libllvm(lib_dir: &Path) -> Result<(PathBuf, u32)> {
    let mut names: Vec<String> = std::fs::read_dir(lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("libLLVM"))
        .collect();
    // `libLLVM.so.<ver>-rust-...` is the shared object; `libLLVM-<major>-rust-....so` is a
    // linker script naming it, useless behind a symlink in another directory. Prefer the
    // former and skip anything that is not ELF.
    names.sort_by_key(|n| !n.starts_with("libLLVM.so."));
    for name in &names {
        let path = lib_dir.join(name);
        if let Some(major) = llvm_major(name).filter(|_| is_elf(&path)) {
            return Ok((path, major));
        }
    }
    bail!(
        "no libLLVM shared library in {} (found {names:?})",
        lib_dir.display()
    )
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

fn llvm_major(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("libLLVM.so.")
        .or_else(|| name.strip_prefix("libLLVM-"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn ensure_bpf_linker() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    if bpf_linker_works(&sysroot) {
        println!("setup: bpf-linker present");
        return Ok(());
    }
    match install_bpf_linker_against_rust_llvm(&sysroot) {
        Ok(()) if bpf_linker_works(&sysroot) => return Ok(()),
        Ok(()) => eprintln!("setup: bpf-linker built but does not run; trying the fallback"),
        Err(e) => eprintln!(
            "setup: linking bpf-linker against rustc's LLVM failed: {e:#}; trying the fallback"
        ),
    }
    run_cmd(Command::new("cargo").env_remove("RUSTUP_TOOLCHAIN").args([
        "install",
        "bpf-linker",
        "--version",
        FALLBACK_BPF_LINKER,
        "--locked",
        "--force",
    ]))?;
    if !bpf_linker_works(&sysroot) {
        bail!("bpf-linker {FALLBACK_BPF_LINKER} installed but does not run");
    }
    Ok(())
}

fn install_bpf_linker_against_rust_llvm(sysroot: &Path) -> Result<()> {
    let (lib, major) = find_libllvm(&sysroot.join("lib"))?;
    let prefix_lib = Path::new(LLVM_PREFIX).join("lib");
    std::fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    let link = prefix_lib.join("libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)
        .with_context(|| format!("linking {} -> {}", link.display(), lib.display()))?;
    run_cmd(
        Command::new("cargo")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .arg(format!("+{}", nightly()))
            .args([
                "install",
                "bpf-linker",
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
                "--force",
            ]),
    )
}

/// Run `cmd` (printed with `tag` first) and fail with its stderr unless it succeeds.
pub(crate) fn run_logged(tag: &str, cmd: &mut Command) -> Result<()> {
    println!("{tag}: {cmd:?}");
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub(crate) fn ensure_apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        println!("setup: apt packages present: {packages:?}");
        return Ok(());
    }
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q"])
            .args(&missing),
    )
}

fn python_has(python: &Path, modules: &[&str]) -> bool {
    Command::new(python)
        .arg("-c")
        .arg(format!("import {}", modules.join(", ")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A Python interpreter that can import `modules`, installing `packages` with pip when it
/// cannot: into `python3` itself when its pip allows that, else into a venv under the target
/// directory (Debian's python refuses system-wide pip installs).
pub(crate) fn ensure_python(packages: &[&str], modules: &[&str]) -> Result<PathBuf> {
    let system = PathBuf::from("python3");
    let venv = crate::ebpf::target_dir().join("tools").join("python");
    let venv_python = venv.join("bin").join("python3");
    for python in [&system, &venv_python] {
        if python_has(python, modules) {
            println!("setup: {} has {modules:?}", python.display());
            return Ok(python.clone());
        }
    }
    if python_has(&system, &["pip"])
        && run_cmd(
            Command::new(&system)
                .args(["-m", "pip", "install", "--quiet"])
                .args(packages),
        )
        .is_ok()
        && python_has(&system, modules)
    {
        return Ok(system);
    }
    if !python_has(&system, &["venv", "ensurepip"]) {
        ensure_apt(&["python3-venv"])?;
    }
    run_cmd(Command::new(&system).args(["-m", "venv"]).arg(&venv))?;
    run_cmd(
        Command::new(&venv_python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(packages),
    )?;
    if !python_has(&venv_python, modules) {
        bail!(
            "installed {packages:?} into {} but cannot import {modules:?}",
            venv.display()
        );
    }
    Ok(venv_python)
}

#[cfg(test)]
mod tests {
    use super::llvm_major;

    #[test]
    fn llvm_major_from_both_name_shapes() {
        assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.97.0-nightly"), Some(22));
        assert_eq!(llvm_major("libLLVM-22-rust-1.97.0-nightly.so"), Some(22));
        assert_eq!(llvm_major("libLLVMfoo.so"), None);
    }
}
