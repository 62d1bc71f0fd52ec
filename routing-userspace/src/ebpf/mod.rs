//! The aya loader for the eBPF data plane: load, pin, attach, and reopen across restarts.
//!
//! One pinned set per node (default `/sys/fs/bpf/flexinfer/`) holds the maps and the cgroup
//! link. The first proxy to start creates and attaches it; every later or concurrent proxy
//! (and a restarted one) opens the pins instead, so a connection is counted once no matter
//! how many proxies run. `cli::detach` removes the set. The object itself is embedded at build
//! time by `build.rs`; an empty embedding means "built without eBPF" and `open` says so.

pub mod addr;
pub mod cgroup;
pub mod cli;
pub mod pins;
pub mod sys;

use std::io;
use std::path::{Path, PathBuf};

pub use pins::PinnedSet;

/// The embedded eBPF object (empty when the binary was built without one).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/routing-ebpf.o"));

/// The eBPF object built into this binary, or `None` if it was built without one
/// (`cargo xtask build-ebpf` before `cargo build`, or `FLEXINFER_EBPF_OBJECT`, embeds it).
pub fn embedded_object() -> Option<&'static [u8]> {
    (!OBJECT.is_empty()).then_some(OBJECT)
}

/// The conventional bpffs mount point, the only one `open` mounts by itself.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
/// Default directory of the pinned set.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/flexinfer";

/// Where and how to load the data plane.
#[derive(Clone, Debug)]
pub struct EbpfOptions {
    /// cgroup2 directory to attach sock_ops to; `None` = the cgroup2 root (every process on
    /// the node), found from /proc/self/mounts.
    pub cgroup: Option<PathBuf>,
    /// Directory for the pins (must be on bpffs).
    pub pin_dir: PathBuf,
    /// The bpffs mount. If it is [`DEFAULT_BPFFS`] and not mounted, `open` mounts it; any other
    /// path must already be a bpffs.
    pub bpffs: PathBuf,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        Self {
            cgroup: None,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            bpffs: PathBuf::from(DEFAULT_BPFFS),
        }
    }
}

/// Why the eBPF gauge could not be opened. Every variant says what to do about it; the proxy
/// logs it once and falls back to the userspace gauge (or exits with `--require-ebpf`).
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("eBPF is not built into this binary (run `cargo xtask build-ebpf` before building, or set FLEXINFER_EBPF_OBJECT)")]
    NotEmbedded,
    #[error("{path} is not a bpf filesystem (mount it: `mount -t bpf bpf {path}`)")]
    NoBpffs { path: PathBuf },
    #[error("mounting bpffs at {path} failed: {source}")]
    MountBpffs { path: PathBuf, source: io::Error },
    #[error("permission denied for BPF while {action} (euid {euid}; needs root or CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN): {source}")]
    PermissionDenied {
        action: &'static str,
        euid: u32,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("no cgroup2 mount found in /proc/self/mounts: mount the unified hierarchy (`mount -t cgroup2 none /sys/fs/cgroup`) or pass --cgroup-path")]
    NoCgroup2,
    #[error("{path} is not a cgroup v2 directory: sock_ops attaches only to cgroup2 (pass a directory of the cgroup2 mount as --cgroup-path, or mount it: `mount -t cgroup2 none /sys/fs/cgroup`)")]
    NotCgroup2 { path: PathBuf },
    #[error("the kernel has no BTF ({path} is missing): the eBPF gauge's maps need a kernel built with CONFIG_DEBUG_INFO_BTF (kernel {kernel}); {source}")]
    NoBtf {
        path: PathBuf,
        kernel: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the kernel's verifier rejected the {program} program (kernel {kernel}); its last words:\n{log}\nThe object must come from `cargo xtask build-ebpf` (it always builds the optimized object the verifier accepts): run it, then rebuild the proxy. If it did, this kernel refuses what the program does: report it with the log above")]
    Verifier {
        program: &'static str,
        kernel: String,
        /// The last lines of the verifier's log.
        log: String,
    },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("loading the eBPF object failed: {0}")]
    Load(Box<dyn std::error::Error + Send + Sync>),
    #[error("attaching sock_ops to cgroup {cgroup} failed: {source}")]
    Attach {
        cgroup: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("nothing pinned at {pin_dir}: no proxy with the eBPF gauge has loaded it on this node, or it was detached (a proxy started with another --bpf-pin-dir pins there)")]
    NothingPinned { pin_dir: PathBuf },
    #[error("pinned set at {pin_dir} is unusable ({what}); remove it with `flexinfer-proxy ebpf detach`")]
    BadPins { pin_dir: PathBuf, what: String },
    #[error("BPF map operation on {map} failed: {source}")]
    Map {
        map: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl EbpfError {
    /// Classify a failed BPF operation: EPERM/EACCES become [`EbpfError::PermissionDenied`].
    pub(crate) fn classify<E>(action: &'static str, err: E, other: impl FnOnce(E) -> Self) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        if is_permission(&err) {
            Self::PermissionDenied {
                action,
                euid: sys::euid(),
                source: Box::new(err),
            }
        } else {
            other(err)
        }
    }
}

/// How many lines of the verifier's log an error quotes: the last ones name the instruction it
/// refused and why.
const VERIFIER_LOG_LINES: usize = 8;

/// The last `VERIFIER_LOG_LINES` non-empty lines of a verifier log, indented for an error
/// message.
pub fn verifier_log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(VERIFIER_LOG_LINES);
    lines[from..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The running kernel's release (`uname -r`), for error messages.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Where the kernel publishes its own BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why loading a program failed: the verifier's refusal (it wrote a log), a missing privilege,
/// a kernel without BTF, or something else.
pub(crate) fn classify_program_load(
    action: &'static str,
    program: &'static str,
    err: aya::programs::ProgramError,
    btf: &Path,
) -> EbpfError {
    if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &err {
        let log = verifier_log.to_string();
        if !log.trim().is_empty() {
            return EbpfError::Verifier {
                program,
                kernel: kernel_release(),
                log: verifier_log_tail(&log),
            };
        }
    }
    classify_load(action, err, btf)
}

/// A failed load without a verifier log: a missing privilege, a kernel without BTF, or
/// something else.
pub(crate) fn classify_load<E>(action: &'static str, err: E, btf: &Path) -> EbpfError
where
    E: std::error::Error + Send + Sync + 'static,
{
    if is_permission(&err) {
        return EbpfError::PermissionDenied {
            action,
            euid: sys::euid(),
            source: Box::new(err),
        };
    }
    if !btf.exists() {
        return EbpfError::NoBtf {
            path: btf.to_path_buf(),
            kernel: kernel_release(),
            source: Box::new(err),
        };
    }
    EbpfError::Load(Box::new(err))
}

/// Whether an error chain bottoms out in EPERM or EACCES.
fn is_permission(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

pub(crate) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> EbpfError + 'a {
    move |source| EbpfError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of a real refusal, captured on kernel 6.18: the unoptimized (dev profile) build
    /// of our sock_ops program, which `cargo xtask build-ebpf` built when run without
    /// `--release` before it always built the release profile.
    const DEV_BUILD_LOG_TAIL: &str = "\
130: (79) r2 = *(u64 *)(r10 -64)      ; R2=map_value(map=PODS,ks=4,vs=192) R10=fp0 fp-64=map_value(map=PODS,ks=4,vs=192)
131: (0f) r2 += r1                    ; R1=scalar(smin=smin32=0,smax=umax=smax32=umax32=112,var_off=(0x0; 0x70)) R2=map_value(map=PODS,ks=4,vs=192,smin=smin32=0,smax=umax=smax32=umax32=112,var_off=(0x0; 0x70))
132: (bf) r1 = r2                     ; R1=map_value(map=PODS,ks=4,vs=192,smin=smin32=0,smax=umax=smax32=umax32=112,var_off=(0x0; 0x70)) R2=map_value(map=PODS,ks=4,vs=192,smin=smin32=0,smax=umax=smax32=umax32=112,var_off=(0x0; 0x70))
133: (57) r1 &= 7
R1 bitwise operator &= on pointer prohibited
verification time 486 usec
stack depth 72+0
processed 55 insns (limit 1000000) max_states_per_insn 0 total_states 3 peak_states 3 mark_read 0
";

    #[test]
    fn a_verifier_refusal_quotes_the_last_lines_of_its_log() {
        // The log's start (how every verifier log starts), then the captured end.
        let log = format!("func#0 @0\n0: R1=ctx() R10=fp0\n\n{DEV_BUILD_LOG_TAIL}\n");
        let tail = verifier_log_tail(&log);
        assert_eq!(tail.lines().count(), VERIFIER_LOG_LINES);
        assert!(tail.contains("R1 bitwise operator &= on pointer prohibited"));
        assert!(!tail.contains("func#0"), "only the end: {tail}");
        let e = EbpfError::Verifier {
            program: "flexinfer_sockops",
            kernel: "6.18.0".into(),
            log: tail,
        };
        let msg = e.to_string();
        assert!(msg.contains("verifier rejected the flexinfer_sockops program (kernel 6.18.0)"));
        assert!(msg.contains("cargo xtask build-ebpf"));
        assert!(!msg.contains("permission"), "{msg}");
        assert_eq!(verifier_log_tail("\n\nonly line\n"), "  only line");
    }

    #[test]
    fn a_load_failure_without_a_log_is_a_privilege_no_btf_or_other() {
        let here = Path::new("/");
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        let e = classify_load("loading sock_ops", eperm, here);
        assert!(matches!(e, EbpfError::PermissionDenied { .. }), "{e}");
        assert!(e.to_string().contains("CAP_BPF"), "{e}");
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        let missing = Path::new("/nonexistent/btf/vmlinux");
        let e = classify_load("loading the object", einval(), missing);
        assert!(matches!(e, EbpfError::NoBtf { .. }), "{e}");
        assert!(e.to_string().contains("CONFIG_DEBUG_INFO_BTF"), "{e}");
        let e = classify_load("loading the object", einval(), here);
        assert!(matches!(e, EbpfError::Load(_)), "{e}");
    }

    #[test]
    fn missing_mounts_say_what_to_mount() {
        let e = EbpfError::NoBpffs {
            path: "/tmp/x".into(),
        };
        assert!(e.to_string().contains("mount -t bpf bpf /tmp/x"));
        assert!(EbpfError::NoCgroup2
            .to_string()
            .contains("mount -t cgroup2"));
        let e = EbpfError::NotCgroup2 {
            path: "/tmp".into(),
        };
        assert!(e.to_string().contains("/tmp is not a cgroup v2 directory"));
    }
}
