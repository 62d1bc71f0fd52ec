//! The eBPF object as `cargo xtask build-ebpf` writes it loads under the kernel's verifier,
//! and every way a load can fail says what is wrong: the verifier's refusal with its log and
//! the fix, a missing privilege with the capabilities, a missing bpffs or cgroup2 with what to
//! mount. Root only; fail instead of skipping under FLEXINFER_REQUIRE_EBPF (CI).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use flexinfer_tests::ebpf::{bpf_or_skip, test_cgroup, TestPins};
use flexinfer_tests::*;
use object::{Object, ObjectSection, ObjectSymbol};
use routing_userspace::ebpf::{embedded_object, EbpfError, PinnedSet};

/// The object `cargo xtask build-ebpf` wrote: `<target>/bpf/routing-ebpf.o`.
fn built_object() -> PathBuf {
    let bin = proxy_bin();
    let target = bin
        .ancestors()
        .find(|a| a.join("bpf").is_dir())
        .unwrap_or_else(|| panic!("no <target>/bpf above {}", bin.display()));
    target.join("bpf").join("routing-ebpf.o")
}

/// The proxy this test binary was built with embeds an object (CI builds it first).
fn embedded() -> &'static [u8] {
    embedded_object().expect("this build embeds the eBPF object (run `cargo xtask build-ebpf`)")
}

#[test]
fn the_object_build_ebpf_wrote_is_embedded_and_loads_under_the_verifier() {
    if !bpf_or_skip() {
        return;
    }
    let path = built_object();
    let object = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        object == embedded(),
        "{} differs from the object this build embeds",
        path.display()
    );
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let set = PinnedSet::open_or_create_with(&object, &pins.opts)
        .unwrap_or_else(|e| panic!("the built object does not load: {e}"));
    assert!(set.created, "a fresh pin dir is created, not reopened");
}

/// `object` with the first instruction of the sock_ops program replaced by a load through R3
/// (`r1 = *(u64 *)(r3 + 0)`): at entry only R1 (the context) and R10 (the frame) hold values,
/// so the verifier refuses the read of R3 (`R3 !read_ok`), whatever the program does next.
fn with_broken_program(object: &[u8]) -> Vec<u8> {
    let file = object::File::parse(object).expect("an ELF object");
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(routing_common::programs::SOCK_OPS))
        .expect("the sock_ops program's symbol");
    let section = file
        .section_by_index(sym.section_index().expect("a section"))
        .expect("its section");
    let (start, _) = section.file_range().expect("the section is in the file");
    let at = (start + sym.address() - section.address()) as usize;
    let mut broken = object.to_vec();
    // BPF_LDX | BPF_MEM | BPF_DW, dst r1, src r3, no offset, no immediate.
    broken[at..at + 8].copy_from_slice(&[0x79, 0x31, 0, 0, 0, 0, 0, 0]);
    broken
}

#[test]
fn a_refused_program_reports_the_verifier_log_and_the_fix() {
    if !bpf_or_skip() {
        return;
    }
    let broken = with_broken_program(embedded());
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let err = match PinnedSet::open_or_create_with(&broken, &pins.opts) {
        Ok(_) => panic!("the verifier accepted a read through an uninitialized register"),
        Err(e) => e,
    };
    assert!(matches!(err, EbpfError::Verifier { .. }), "{err:?}");
    let msg = err.to_string();
    for want in [
        "verifier rejected the flexinfer_sockops program",
        "R3 !read_ok",
        "cargo xtask build-ebpf",
        &routing_userspace::ebpf::kernel_release(),
    ] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
    assert!(!msg.contains("permission denied"), "{msg}");
    assert!(
        !pins.opts.pin_dir.join(routing_common::LAYOUT).exists(),
        "a refused load leaves nothing pinned"
    );
}

/// `flexinfer-proxy serve --gauge ebpf` as `uid`, to the point where it gives up.
fn serve_as(uid: u32, dir: &Path) -> std::process::Output {
    let models = ModelsFile::new().model(ModelEntry::new("m").endpoint("127.0.0.1:9"));
    let config = dir.join("models.yaml");
    std::fs::write(&config, models.to_yaml()).expect("models file");
    Command::new(proxy_bin())
        .args(["serve", "--gauge", "ebpf", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .uid(uid)
        .gid(uid)
        .output()
        .expect("running the proxy")
}

#[test]
fn without_privilege_the_error_names_the_capabilities() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-unprivileged");
    // `nobody` must read the models file and enter the directory.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let out = serve_as(65534, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("eBPF gauge required but unavailable"),
        "{stderr}"
    );
    assert!(stderr.contains("permission denied for BPF"), "{stderr}");
    assert!(stderr.contains("euid 65534"), "{stderr}");
    assert!(stderr.contains("CAP_BPF"), "{stderr}");
    assert!(!stderr.contains("verifier"), "{stderr}");
}
